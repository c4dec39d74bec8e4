package health

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// readyManaged creates a Managed Proxy and marks it Ready at ip:3128, as the
// reconciler would.
func readyManaged(t *testing.T, c client.Client, ns, name, ip string) *crawlv1alpha1.Proxy {
	t.Helper()
	ctx := context.Background()
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128},
	}
	require.NoError(t, c.Create(ctx, p))
	p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128, InstanceName: "px-" + name, SpecHash: "h"}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "InstanceRunning", Message: "x"})
	require.NoError(t, c.Status().Update(ctx, p))
	return p
}

// updateProxy changes a Proxy as a writer racing the engine does.
func updateProxy(t *testing.T, c client.Client, key client.ObjectKey, change func(*crawlv1alpha1.Proxy) error) {
	t.Helper()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p crawlv1alpha1.Proxy
		if err := c.Get(context.Background(), key, &p); err != nil {
			return err
		}
		return change(&p)
	}))
}

// TestEngineTellsTheReconciler: verdict changes of Managed proxies arrive on
// Notify, each recorded transition leaves an Event, and Health reports since
// when a proxy fails and how its probe URL fares across the fleet.
func TestEngineTellsTheReconciler(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	a := readyManaged(t, env.Client, ns, "a", "127.0.0.31")
	b := readyManaged(t, env.Client, ns, "b", "127.0.0.32")
	ext := readyExternal(t, env.Client, ns, "ext", "127.0.0.33", 3128)
	prober := &scriptedProber{scripts: map[string][]Result{
		"127.0.0.31:3128": {fail, fail, fail, fail, pass, pass},
		"127.0.0.32:3128": {pass, pass, pass, pass, pass, pass},
		"127.0.0.33:3128": {fail, fail, fail, fail, fail, fail},
	}}
	clk := clocktesting.NewFakeClock(time.Now())
	notify := make(chan event.GenericEvent, 16)
	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2, Clock: clk,
		Defaults: Settings{URL: "https://probe.test/", Interval: 10 * time.Second, Timeout: time.Second, FailureThreshold: 2, SuccessThreshold: 1},
		Recorder: mgr.GetEventRecorder("egress-proxies-operator"), Notify: notify,
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)
	keyA, keyB, keyExt := client.ObjectKeyFromObject(a), client.ObjectKeyFromObject(b), client.ObjectKeyFromObject(ext)

	var failedAt time.Time
	require.Eventually(t, func() bool {
		if h, ok := engine.Health(keyA); ok && h.Verdict == Unhealthy {
			failedAt = h.UnhealthySince
			return true
		}
		clk.Step(time.Second)
		return false
	}, 10*time.Second, time.Millisecond)
	h, _ := engine.Health(keyA)
	assert.Equal(t, "https://probe.test/", h.URL)
	assert.Equal(t, 2, h.Probed, "two Managed proxies probed against the URL; the External one is not counted")
	assert.Equal(t, 1, h.Unhealthy)
	assert.False(t, failedAt.IsZero())
	hb, _ := engine.Health(keyB)
	assert.True(t, hb.UnhealthySince.IsZero(), "a healthy proxy has no Unhealthy-since")

	got := map[client.ObjectKey]int{}
	drain := func() {
		for {
			select {
			case ev := <-notify:
				got[client.ObjectKeyFromObject(ev.Object)]++
			default:
				return
			}
		}
	}
	require.Eventually(t, func() bool { drain(); return got[keyA] >= 1 && got[keyB] >= 1 }, 5*time.Second, time.Millisecond)
	// Its probes run on their own jittered schedule: it may need more time.
	require.Eventually(t, func() bool {
		if v, _ := engine.Verdict(keyExt); v == Unhealthy {
			return true
		}
		clk.Step(time.Second)
		return false
	}, 5*time.Second, time.Millisecond, "the External one fails too")
	drain()
	assert.Zero(t, got[keyExt], "External proxies are never replaced: no notification")

	// Recovery: the count drops, Unhealthy-since clears, and both
	// transitions left an Event that kubectl describe shows.
	require.Eventually(t, func() bool {
		if h, ok := engine.Health(keyA); ok && h.Verdict == Healthy {
			return true
		}
		clk.Step(time.Second)
		return false
	}, 10*time.Second, time.Millisecond)
	h, _ = engine.Health(keyA)
	assert.Zero(t, h.Unhealthy)
	assert.True(t, h.UnhealthySince.IsZero())
	require.Eventually(t, func() bool {
		return eventFor(t, env.Client, ns, "a", EventReasonUnhealthy, corev1.EventTypeWarning) &&
			eventFor(t, env.Client, ns, "a", EventReasonHealthy, corev1.EventTypeNormal)
	}, 10*time.Second, 10*time.Millisecond, "a Warning Unhealthy and a Normal Healthy Event")
	// b came up healthy and stayed so: its first verdict is its status's
	// to tell, not an Event's (a write per proxy at bring-up).
	assert.False(t, eventFor(t, env.Client, ns, "b", EventReasonHealthy, corev1.EventTypeNormal), "no Event for a new proxy's first Healthy verdict")
}

func eventFor(t *testing.T, c client.Client, ns, name, reason, eventType string) bool {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(context.Background(), &list, client.InNamespace(ns)))
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason && e.Type == eventType && e.Note != "" {
			return true
		}
	}
	return false
}

// TestEngineFollowsTheSpec: a new External address is probed at once and
// is never served on the old address's verdict; a shorter interval takes
// effect at the next probe, not after one more old interval.
func TestEngineFollowsTheSpec(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := readyExternal(t, env.Client, ns, "moves", "127.0.0.34", 3128)
	key := client.ObjectKeyFromObject(px)
	prober := &scriptedProber{scripts: map[string][]Result{
		"127.0.0.34:3128": {pass, pass, pass},
		"127.0.0.35:3128": {pass, pass, pass, pass, pass, pass, pass, pass},
	}}
	clk := clocktesting.NewFakeClock(time.Now())
	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2, Clock: clk,
		Defaults: Settings{URL: "https://probe.test/", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
		// With jitter, a new proxy's first probe may wait minutes: only a
		// changed address is probed at once.
		Jitter: 0.5,
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)
	require.Eventually(t, func() bool {
		if v, _ := engine.Verdict(key); v == Healthy {
			return true
		}
		clk.Step(time.Minute)
		return false
	}, 10*time.Second, time.Millisecond)
	_, known := engine.VerdictAt(key, "127.0.0.35:3128")
	assert.False(t, known, "no verdict for an address nobody probed")

	// The spec moves the proxy: probed at once, with no clock step, and
	// the new address recorded with its first verdict.
	updateProxy(t, env.Client, key, func(p *crawlv1alpha1.Proxy) error {
		p.Spec.External.Address = "127.0.0.35"
		return env.Client.Update(context.Background(), p)
	})
	require.Eventually(t, func() bool { return prober.probes("127.0.0.35:3128") == 1 }, 5*time.Second, time.Millisecond,
		"the new address is probed at once, not an hour later")
	require.Eventually(t, func() bool { v, ok := engine.VerdictAt(key, "127.0.0.35:3128"); return ok && v == Healthy }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		var p crawlv1alpha1.Proxy
		require.NoError(t, env.Client.Get(context.Background(), key, &p))
		return p.Status.IP == "127.0.0.35" && p.IsReady()
	}, 5*time.Second, time.Millisecond, "the engine records the new address with its verdict")

	// A shorter interval: the next probe is due by it.
	updateProxy(t, env.Client, key, func(p *crawlv1alpha1.Proxy) error {
		p.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{Interval: &metav1.Duration{Duration: 5 * time.Second}}
		return env.Client.Update(context.Background(), p)
	})
	require.Eventually(t, func() bool {
		engine.mu.RLock()
		defer engine.mu.RUnlock()
		return engine.targets[key].settings.Value().Interval == 5*time.Second
	}, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		if prober.probes("127.0.0.35:3128") >= 3 {
			return true
		}
		clk.Step(time.Second)
		return false
	}, 10*time.Second, time.Millisecond, "two more probes within seconds of fake time, not an hour")
}
