package health

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// newExternal creates an External Proxy at ip:port with no status yet, as
// the reconciler first sees one, and deletes it at the end: the engine of a
// later run probes every namespace's Proxies, and the address is the same.
func newExternal(t *testing.T, c client.Client, ns, name, ip string, port int32) *crawlv1alpha1.Proxy {
	t.Helper()
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: port,
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
	}
	require.NoError(t, c.Create(context.Background(), p))
	t.Cleanup(func() { require.NoError(t, client.IgnoreNotFound(c.Delete(context.Background(), p))) })
	return p
}

// wouldRecord is p with the status the reconciler is about to write: the
// address, provisioned, its verdict awaited.
func wouldRecord(p *crawlv1alpha1.Proxy) *crawlv1alpha1.Proxy {
	would := p.DeepCopy()
	would.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: p.Spec.External.Address, Port: p.Spec.Port}
	meta.SetStatusCondition(&would.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "External", Message: "x"})
	meta.SetStatusCondition(&would.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: crawlv1alpha1.ReasonAwaitingProbe, Message: "x"})
	would.Status.SetReadyCondition(p.Generation)
	return would
}

// startAheadEngine runs an engine on a fake clock whose status writes to key
// are counted, and returns it with its notifications.
func startAheadEngine(t *testing.T, env *testenv.Env, key types.NamespacedName, prober Prober, clk *clocktesting.FakeClock, writes *atomic.Int64) (*Engine, <-chan event.GenericEvent) {
	t.Helper()
	notify := make(chan event.GenericEvent, 64)
	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: countingClient{mgr.GetClient(), key, writes}, Reader: mgr.GetAPIReader(),
		Prober: prober, Workers: 2, Clock: clk, Notify: notify,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 30 * time.Second, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1},
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)
	return engine, notify
}

// awaitNotice waits for the engine to tell the reconciler about key.
func awaitNotice(t *testing.T, notify <-chan event.GenericEvent, key types.NamespacedName) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e := <-notify:
			if client.ObjectKeyFromObject(e.Object) == key {
				return
			}
		case <-deadline:
			t.Fatalf("the engine never told the reconciler that %s was probed", key)
		}
	}
}

// TestProbeAheadRecordsTheFirstVerdictWithTheAddress: a new proxy's address
// is probed before its status names it; a passing probe is recorded with the
// address in the reconciler's one write, and the engine neither probes it
// again at once nor writes the verdict a second time.
func TestProbeAheadRecordsTheFirstVerdictWithTheAddress(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	const addr = "127.0.0.24:3128"
	p := newExternal(t, env.Client, ns, "ext-ahead", "127.0.0.24", 3128)
	key := client.ObjectKeyFromObject(p)
	prober := &scriptedProber{scripts: map[string][]Result{addr: {pass, pass, pass}}}
	clk := clocktesting.NewFakeClock(time.Now())
	var writes atomic.Int64
	engine, notify := startAheadEngine(t, env, key, prober, clk, &writes)

	would := wouldRecord(p)
	_, done := engine.ProbeAhead(would)
	require.False(t, done, "nothing is known of an address before its probe")
	awaitNotice(t, notify, key)
	first, done := engine.ProbeAhead(would)
	require.True(t, done)
	assert.Equal(t, Healthy, first.Verdict, "one pass is the success threshold")
	assert.True(t, first.Result.Success)
	_, done = engine.ProbeAhead(would)
	assert.True(t, done)
	assert.Equal(t, int64(1), prober.probes(addr), "asking again is answered from the probe already made")
	_, tracked := engine.Verdict(key)
	assert.False(t, tracked, "an address probed ahead is not served before its status names it")

	// The reconciler's write: the address with the verdict, Ready.
	now := metav1.NewTime(first.At)
	healthy := HealthyCondition(Healthy, first.Result, p.Generation, now)
	p.Status = would.Status
	meta.SetStatusCondition(&p.Status.Conditions, healthy)
	p.Status.LastHealthCheckTime = &now
	p.Status.SetReadyCondition(p.Generation)
	require.True(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady))
	require.NoError(t, env.Client.Status().Update(context.Background(), p))

	require.Eventually(t, func() bool { v, ok := engine.Verdict(key); return ok && v == Healthy }, 5*time.Second, 5*time.Millisecond,
		"the engine takes the proxy up with the verdict the status records")
	time.Sleep(100 * time.Millisecond) // give a wrong immediate probe or write the chance to show
	assert.Equal(t, int64(1), prober.probes(addr), "the probe ahead was the instance's first: no second one at once")
	assert.Equal(t, int64(0), writes.Load(), "the verdict the reconciler recorded is not written again")

	// The next probe is due an interval after the one ahead.
	require.Eventually(t, func() bool {
		if prober.probes(addr) >= 2 {
			return true
		}
		clk.Step(3 * time.Second)
		return false
	}, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(2), prober.probes(addr))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(0), writes.Load(), "an unchanged verdict writes nothing")
}

// TestProbeAheadLeavesAnUndecidedVerdictToTheEngine: a first probe that
// fails is no verdict (three failures are); the reconciler records the
// address awaiting one, and the engine carries on from the failed probe:
// the next is due soon, and the verdict it reaches is the engine's to write.
// A result older than the interval is not reused, and another address is
// probed afresh.
func TestProbeAheadLeavesAnUndecidedVerdictToTheEngine(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	const addr = "127.0.0.25:3128"
	p := newExternal(t, env.Client, ns, "ext-ahead-fail", "127.0.0.25", 3128)
	key := client.ObjectKeyFromObject(p)
	prober := &scriptedProber{scripts: map[string][]Result{addr: {fail, fail, fail, pass}, "127.0.0.26:3128": {pass}}}
	clk := clocktesting.NewFakeClock(time.Now())
	var writes atomic.Int64
	engine, notify := startAheadEngine(t, env, key, prober, clk, &writes)

	would := wouldRecord(p)
	_, done := engine.ProbeAhead(would)
	require.False(t, done)
	awaitNotice(t, notify, key)
	first, done := engine.ProbeAhead(would)
	require.True(t, done)
	assert.Equal(t, Unknown, first.Verdict, "one failure of three is no verdict")
	assert.False(t, first.Result.Success)

	// Stale: a result older than the interval is asked for again.
	clk.Step(31 * time.Second)
	_, done = engine.ProbeAhead(would)
	require.False(t, done, "a result older than the interval is not reused")
	awaitNotice(t, notify, key)
	first, done = engine.ProbeAhead(would)
	require.True(t, done)
	assert.Equal(t, Unknown, first.Verdict)
	assert.Equal(t, int64(2), prober.probes(addr))

	// Another address is another probe.
	elsewhere := would.DeepCopy()
	elsewhere.Status.IP = "127.0.0.26"
	_, done = engine.ProbeAhead(elsewhere)
	require.False(t, done, "a probe of one address says nothing of another")
	awaitNotice(t, notify, key)
	moved, done := engine.ProbeAhead(elsewhere)
	require.True(t, done)
	assert.Equal(t, Healthy, moved.Verdict)

	// Back at the first address: asked for again, its probe fails again, and
	// the reconciler records the address awaiting a verdict; the engine
	// carries on and writes the verdict it reaches.
	_, done = engine.ProbeAhead(would)
	require.False(t, done)
	awaitNotice(t, notify, key)
	first, done = engine.ProbeAhead(would)
	require.True(t, done)
	require.Equal(t, Unknown, first.Verdict)
	p.Status = would.Status
	require.NoError(t, env.Client.Status().Update(context.Background(), p))
	require.Eventually(t, func() bool { _, ok := engine.Verdict(key); return ok }, 5*time.Second, 5*time.Millisecond)
	v, _ := engine.Verdict(key)
	assert.Equal(t, Unknown, v)
	require.Eventually(t, func() bool {
		cond, _ := healthyCondition(t, env.Client, key)
		if cond != nil && cond.Status == metav1.ConditionTrue {
			return true
		}
		clk.Step(time.Second)
		return false
	}, 10*time.Second, 5*time.Millisecond, "the engine probes on and records the verdict")
	// The write is counted once its Update returns, which may be after the
	// Get above already sees it.
	require.Eventually(t, func() bool { return writes.Load() >= 1 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // give a second write the chance to show
	assert.Equal(t, int64(1), writes.Load(), "the engine wrote the one verdict it reached")
	assert.Equal(t, int64(4), prober.probes(addr), "three probes ahead, then the engine's own, which passed")
}
