package health

import (
	"context"
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

// sinkRecord keeps what the engine handed the outcome sink.
type sinkRecord struct {
	mu   sync.Mutex
	got  []string
	cool time.Duration
}

func (s *sinkRecord) CanaryOutcome(_ context.Context, proxy types.NamespacedName, host string, blocked bool, cooldown time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, proxy.Name+" "+host)
	if blocked {
		s.cool = cooldown
	}
}

// TestCanariesAndEgress: a proxy that passes its probes gets its canaries
// fetched; a blocked one is recorded in status.canaries and handed to the
// outcome sink with the canary interval as cooldown, and the proxy stays
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
	assert.Equal(t, time.Minute, sink.cool, "it cools the proxy for the host until the next canary")
}
