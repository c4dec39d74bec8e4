package health

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestJudgeCanary(t *testing.T) {
	shop := crawlv1alpha1.CanaryTarget{Name: "shop", URL: "https://shop.example/", BlockedMarker: "captcha"}
	cases := []struct {
		name   string
		c      crawlv1alpha1.CanaryTarget
		status int
		body   string
		want   string
	}{
		{"200 is allowed by default", shop, 200, "<html>products</html>", crawlv1alpha1.CanaryAllowed},
		{"403 is not an allowed status", shop, 403, "", crawlv1alpha1.CanaryBlocked},
		{"a ban page served with 200", shop, 200, "please solve this captcha", crawlv1alpha1.CanaryBlocked},
		{"the statuses the canary allows", crawlv1alpha1.CanaryTarget{Name: "x", URL: "https://x.example/", AllowedStatuses: []int32{200, 404}}, 404, "", crawlv1alpha1.CanaryAllowed},
		{"and only them", crawlv1alpha1.CanaryTarget{Name: "x", URL: "https://x.example/", AllowedStatuses: []int32{204}}, 200, "", crawlv1alpha1.CanaryBlocked},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := judgeCanary(c.c, c.status, []byte(c.body))
			assert.Equal(t, c.want, got.Verdict, got.Message)
		})
	}
}

func TestParseEcho(t *testing.T) {
	for body, want := range map[string]string{
		"127.0.0.9\n":                       "127.0.0.9",
		`{"ip":"127.0.0.9"}`:                "127.0.0.9",
		`{"origin":"127.0.0.9, 127.0.0.1"}`: "127.0.0.9",
		"::1":                               "::1",
		"<html>not an address</html>":       "",
		`{"ip":"not an address"}`:           "",
		"":                                  "",
	} {
		assert.Equal(t, want, parseEcho([]byte(body)), "%q", body)
	}
}

func TestRecordable(t *testing.T) {
	assert.True(t, recordable("", crawlv1alpha1.CanaryUnknown), "a first verdict, even Unknown")
	assert.True(t, recordable(crawlv1alpha1.CanaryAllowed, crawlv1alpha1.CanaryBlocked))
	assert.False(t, recordable(crawlv1alpha1.CanaryBlocked, crawlv1alpha1.CanaryUnknown), "a failed fetch never hides a verdict")
	assert.False(t, recordable(crawlv1alpha1.CanaryBlocked, crawlv1alpha1.CanaryBlocked))
}

// fixedCanaries answers every canary with verdict.
type fixedCanaries struct{ verdict string }

func (f fixedCanaries) Canary(context.Context, CanaryRequest) CanaryResult {
	return CanaryResult{Verdict: f.verdict, Message: "answered 403, not an allowed status"}
}

// sequenceCanaries answers its verdicts in turn, then the last forever.
type sequenceCanaries struct {
	mu       sync.Mutex
	verdicts []string
}

func (s *sequenceCanaries) Canary(context.Context, CanaryRequest) CanaryResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.verdicts[0]
	if len(s.verdicts) > 1 {
		s.verdicts = s.verdicts[1:]
	}
	return CanaryResult{Verdict: v, Message: "the canary's " + v}
}

// sinkRecord keeps what the engine handed the outcome sink.
type sinkRecord struct {
	mu    sync.Mutex
	got   []string
	cool  time.Duration
	ended []time.Time
}

func (s *sinkRecord) CanaryOutcome(_ context.Context, proxy types.NamespacedName, host string, blocked bool, hold time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, proxy.Name+" "+host)
	if blocked {
		s.cool = hold
	}
}

func (s *sinkRecord) EndCanaryHold(_ context.Context, _ types.NamespacedName, _ string, notAfter time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = append(s.ended, notAfter)
}

// TestCanariesAndEgress: a proxy that passes its probes gets its canaries
// fetched; a blocked one is recorded in status.canaries and handed to the
// outcome sink with a hold of three canary intervals, and the proxy stays
// Healthy; the echo's answer, another address than the proxy's, is
// recorded as status.egressIP.
func TestCanariesAndEgress(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := readyExternal(t, env.Client, ns, "canaried", "127.0.0.31", 3128)
	px.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{Targets: []crawlv1alpha1.CanaryTarget{{Name: "shop", URL: "https://Shop.Example:8443/cart"}}}
	require.NoError(t, env.Client.Update(context.Background(), px))
	key := client.ObjectKeyFromObject(px)
	passing := Result{Success: true, Reason: ReasonProbeSucceeded, Message: "ok", EgressIP: "127.0.0.99"}
	prober := &scriptedProber{scripts: map[string][]Result{"127.0.0.31:3128": {passing, passing, passing, passing}}}
	sink := &sinkRecord{}
	mgr := startEngineManager(t, env)
	require.NoError(t, mgr.Add(NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2,
		Canaries: fixedCanaries{crawlv1alpha1.CanaryBlocked}, Outcomes: sink, CanaryInterval: time.Minute, EchoURL: "http://127.0.0.1/ip",
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
	})))
	run(t, mgr)

	var p crawlv1alpha1.Proxy
	require.Eventually(t, func() bool {
		return env.Client.Get(context.Background(), key, &p) == nil && len(p.Status.Canaries) == 1 && p.Status.EgressIP != ""
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "127.0.0.99", p.Status.EgressIP)
	assert.Equal(t, crawlv1alpha1.CanaryStatus{Name: "shop", Host: "shop.example", Verdict: crawlv1alpha1.CanaryBlocked,
		Message: "answered 403, not an allowed status", LastTransitionTime: p.Status.Canaries[0].LastTransitionTime}, p.Status.Canaries[0])
	cond, _ := healthyCondition(t, env.Client, key)
	assert.Equal(t, "True", string(cond.Status), "a failing canary never makes the proxy Unhealthy")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	assert.Equal(t, []string{"canaried shop.example"}, sink.got)
	assert.Equal(t, canaryHoldIntervals*time.Minute, sink.cool, "it holds the proxy away from the host past the next canary, which renews or ends the hold")
	assert.Empty(t, sink.ended, "nothing said Allowed")
}

// TestAnAllowedCanaryEndsTheHold: a Blocked canary holds its proxy away
// from the host, every Blocked one renews the hold, and the first Allowed
// one ends it (a hold ending no later than the last Blocked one set), so
// the proxy is neither leased for the host between two canaries nor kept
// from it after the site lets it in again.
func TestAnAllowedCanaryEndsTheHold(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := readyExternal(t, env.Client, ns, "flip", "127.0.0.32", 3128)
	px.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{Targets: []crawlv1alpha1.CanaryTarget{{Name: "shop", URL: "https://shop.example/"}}}
	require.NoError(t, env.Client.Update(context.Background(), px))
	passing := Result{Success: true, Reason: ReasonProbeSucceeded, Message: "ok"}
	prober := &scriptedProber{scripts: map[string][]Result{"127.0.0.32:3128": slices.Repeat([]Result{passing}, 1000)}}

	sink := &sinkRecord{}
	canaries := &sequenceCanaries{verdicts: []string{crawlv1alpha1.CanaryBlocked, crawlv1alpha1.CanaryBlocked, crawlv1alpha1.CanaryAllowed}}
	mgr := startEngineManager(t, env)
	start := time.Now()
	require.NoError(t, mgr.Add(NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2,
		Canaries: canaries, Outcomes: sink, CanaryInterval: 50 * time.Millisecond, CanaryHostInterval: time.Millisecond,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 20 * time.Millisecond, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
	})))
	run(t, mgr)

	require.Eventually(t, func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.ended) > 0
	}, 10*time.Second, 10*time.Millisecond, "the Allowed canary ended the hold")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.GreaterOrEqual(t, len(sink.got), 3, "two Blocked, then the Allowed")
	assert.Len(t, sink.ended, 1, "one hold to end")
	hold := canaryHoldIntervals * 50 * time.Millisecond
	assert.WithinRange(t, sink.ended[0], start.Add(hold), time.Now().Add(hold+canaryHoldSkew),
		"the end asked covers the last Blocked canary's hold, and no cooldown beyond it")
}
