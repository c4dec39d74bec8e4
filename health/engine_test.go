package health

import (
	"context"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopShared()
	os.Exit(code)
}

// scriptedProber answers each proxy address from a script of results, and
// counts probes per address (the engine probes every namespace's Proxies,
// other tests' included).
type scriptedProber struct {
	mu      sync.Mutex
	scripts map[string][]Result
	counts  map[string]int64
}

func (s *scriptedProber) probes(addr string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[addr]
}

func (s *scriptedProber) Probe(_ context.Context, req ProbeRequest) Result {
	addr := req.ProxyAddr
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int64{}
	}
	s.counts[addr]++
	script := s.scripts[addr]
	if len(script) == 0 {
		return Result{Reason: ReasonConnectRefused, Message: "no script for " + addr}
	}
	r := script[0]
	s.scripts[addr] = script[1:]
	return r
}

// countingClient counts status writes to one Proxy.
type countingClient struct {
	client.Client
	key    types.NamespacedName
	writes *atomic.Int64
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingStatus{c.Client.Status(), c.key, c.writes}
}

type countingStatus struct {
	client.SubResourceWriter
	key    types.NamespacedName
	writes *atomic.Int64
}

func (s countingStatus) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	err := s.SubResourceWriter.Apply(ctx, obj, opts...)
	if p, ok := obj.(*acv1alpha1.ProxyApplyConfiguration); ok && err == nil && *p.Name == s.key.Name && *p.Namespace == s.key.Namespace {
		s.writes.Add(1) // counted once it landed, so the test can read it
	}
	return err
}

func startEngineManager(t *testing.T, env *testenv.Env) manager.Manager {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	require.NoError(t, err)
	return mgr
}

func run(t *testing.T, mgr manager.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))
}

// readyExternal creates an External Proxy and marks it Ready at addr, as the
// reconciler would.
func readyExternal(t *testing.T, c client.Client, ns, name, ip string, port int32) *crawlv1alpha1.Proxy {
	t.Helper()
	ctx := context.Background()
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: port,
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
	}
	require.NoError(t, c.Create(ctx, p))
	p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: port}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "External", Message: "x"})
	require.NoError(t, c.Status().Update(ctx, p))
	return p
}

func healthyCondition(t *testing.T, c client.Client, key types.NamespacedName) (*metav1.Condition, *crawlv1alpha1.Proxy) {
	t.Helper()
	var p crawlv1alpha1.Proxy
	require.NoError(t, c.Get(context.Background(), key, &p))
	return meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy), &p
}

// TestAnExternalProxyComesUpWithOneWrite: an External proxy has nothing to
// provision, so nobody records it before its first verdict; the engine
// writes its record (phase Ready, its spec's address, Provisioned) and
// that verdict in one status write, as the one writer of its status.
func TestAnExternalProxyComesUpWithOneWrite(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fresh"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128,
			External: &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.28", Port: 8080}}}
	require.NoError(t, env.Client.Create(context.Background(), px))
	key := client.ObjectKeyFromObject(px)
	prober := &scriptedProber{scripts: map[string][]Result{"127.0.0.28:8080": {pass, pass}}}
	// This namespace only: the shared API server holds other tests'
	// proxies, whose verdicts would be writes too.
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	require.NoError(t, err)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2, Clock: clock.RealClock{},
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 1, SuccessThreshold: 1},
	})
	writes := testutil.ToFloat64(statusWrites)
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)
	var p crawlv1alpha1.Proxy
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.Get(context.Background(), key, &p))
		return p.IsReady()
	}, 10*time.Second, 5*time.Millisecond, "Ready from the engine alone")
	assert.Equal(t, crawlv1alpha1.PhaseReady, p.Status.Phase)
	assert.Equal(t, "127.0.0.28", p.Status.IP)
	assert.Equal(t, int32(8080), p.Status.Port, "spec.external.port")
	assert.Equal(t, p.Generation, p.Status.ObservedGeneration)
	provisioned := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
	require.NotNil(t, provisioned)
	assert.Equal(t, crawlv1alpha1.ReasonExternal, provisioned.Reason)
	assert.True(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady))
	// The counter moves once the write has returned, which the Proxy may
	// show first.
	require.Eventually(t, func() bool { return testutil.ToFloat64(statusWrites)-writes >= 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(statusWrites)-writes, "one status write brings it up")
	for _, m := range p.ManagedFields {
		if m.Subresource == "status" {
			assert.Equal(t, crawlv1alpha1.FieldManagerHealth, m.Manager, "one writer of its status")
		}
	}
}

// TestTransitionOnlyWrites probes a proxy many times on a fake clock against
// a real API server and counts status writes: none while the verdict holds,
// exactly one per transition.
func TestTransitionOnlyWrites(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := readyExternal(t, env.Client, ns, "ext-1", "127.0.0.21", 3128)
	key := client.ObjectKeyFromObject(px)

	var script []Result
	for range 10 {
		script = append(script, pass)
	}
	script = append(script, fail, fail, pass) // a blip: stays Healthy
	for range 8 {
		script = append(script, fail) // Unhealthy at the third
	}
	for range 5 {
		script = append(script, pass) // Healthy again at once
	}
	prober := &scriptedProber{scripts: map[string][]Result{"127.0.0.21:3128": script}}
	clk := clocktesting.NewFakeClock(time.Now())
	var writes atomic.Int64

	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: countingClient{mgr.GetClient(), key, &writes},
		Prober: prober, Workers: 4, Clock: clk,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 30 * time.Second, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1},
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)

	// probeUntil advances the fake clock one interval at a time until the
	// proxy has been probed n times in all.
	const addr = "127.0.0.21:3128"
	probeUntil := func(n int64) {
		t.Helper()
		// Steps of a tenth of the interval: reading the count and stepping
		// race with a probe finishing, and an overshoot of 3s can never
		// reach the next probe, due 30s after the last.
		require.Eventually(t, func() bool {
			if prober.probes(addr) >= n {
				return true
			}
			clk.Step(3 * time.Second)
			return false
		}, 10*time.Second, time.Millisecond)
		require.Equal(t, n, prober.probes(addr), "one probe per interval, never more")
	}
	settled := func(wantWrites int64) {
		t.Helper()
		require.Eventually(t, func() bool { return writes.Load() == wantWrites }, 5*time.Second, 5*time.Millisecond,
			"want %d status writes, have %d", wantWrites, &writes)
	}

	probeUntil(1)
	settled(1)
	cond, p := healthyCondition(t, env.Client, key)
	require.NotNil(t, cond)
	assert.Equal(t, metav1.ConditionTrue, cond.Status)
	assert.True(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady), "Ready follows Healthy")
	firstCheck := p.Status.LastHealthCheckTime
	require.NotNil(t, firstCheck)
	v, ok := engine.Verdict(key)
	assert.True(t, ok)
	assert.Equal(t, Healthy, v)

	probeUntil(13) // nine more passes, then fail, fail, pass
	settled(1)
	assert.Equal(t, int64(1), writes.Load(), "12 probes with an unchanged verdict wrote nothing")
	_, p = healthyCondition(t, env.Client, key)
	assert.Equal(t, firstCheck.Unix(), p.Status.LastHealthCheckTime.Unix(), "lastHealthCheckTime moves only on transitions")

	probeUntil(15)
	settled(1)
	probeUntil(16) // the third failure in a row
	settled(2)
	cond, p = healthyCondition(t, env.Client, key)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Equal(t, ReasonTimeout, cond.Reason)
	assert.Equal(t, clk.Now().Unix(), cond.LastTransitionTime.Unix(), "transitions are stamped by the engine's clock")
	assert.False(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady))
	v, _ = engine.Verdict(key)
	assert.Equal(t, Unhealthy, v)

	probeUntil(21) // five more failures
	settled(2)
	probeUntil(22) // recovery
	settled(3)
	cond, _ = healthyCondition(t, env.Client, key)
	assert.Equal(t, metav1.ConditionTrue, cond.Status)
	probeUntil(26)
	settled(3)
	assert.Equal(t, int64(3), writes.Load(), "26 probes, 3 transitions, 3 writes")

	// Deleting the Proxy stops its probes and drops its verdict.
	require.NoError(t, env.Client.Delete(context.Background(), px))
	require.Eventually(t, func() bool { _, ok := engine.Verdict(key); return !ok }, 5*time.Second, 5*time.Millisecond)
	before := prober.probes(addr)
	for range 30 {
		clk.Step(3 * time.Second)
	}
	time.Sleep(50 * time.Millisecond) // give a wrongly scheduled probe the chance to show
	assert.Equal(t, before, prober.probes(addr), "a deleted proxy is not probed")
}

// TestReplacementStartsClean: a replaced proxy (new IP) is probed at its new
// address from a clean slate.
func TestReplacementStartsClean(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	px := readyManaged(t, env.Client, ns, "moved", "127.0.0.22")
	key := client.ObjectKeyFromObject(px)
	prober := &scriptedProber{scripts: map[string][]Result{
		"127.0.0.22:3128": {pass, pass, pass, pass, pass, pass, pass, pass},
		"127.0.0.23:3128": {fail, fail, fail, fail, fail, fail, fail, fail},
	}}
	clk := clocktesting.NewFakeClock(time.Now())
	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: prober, Workers: 2, Clock: clk,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 10 * time.Second, Timeout: time.Second, FailureThreshold: 2, SuccessThreshold: 1},
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)
	require.Eventually(t, func() bool { v, _ := engine.Verdict(key); return v == Healthy }, 5*time.Second, 5*time.Millisecond)

	// The reconciler replaces the instance: a new IP, and nothing of the
	// engine's fields (it applies only its own).
	reconcilerApplies := func(phase crawlv1alpha1.ProxyPhase, ip string) {
		t.Helper()
		apply := acv1alpha1.Proxy(px.Name, px.Namespace).WithStatus(acv1alpha1.ProxyStatus().WithPhase(phase).WithIP(ip).WithPort(3128))
		require.NoError(t, env.Client.Status().Apply(context.Background(), apply, client.FieldOwner(crawlv1alpha1.FieldManagerReconciler), client.ForceOwnership))
	}
	reconcilerApplies(crawlv1alpha1.PhaseReady, "127.0.0.23")
	require.Eventually(t, func() bool { v, _ := engine.Verdict(key); return v == Unknown }, 5*time.Second, 5*time.Millisecond,
		"a replaced proxy has no verdict until probed")
	var p crawlv1alpha1.Proxy
	require.NoError(t, env.Client.Get(context.Background(), key, &p))
	assert.False(t, p.IsReady(), "the old address's verdict does not make the new one Ready")
	require.Eventually(t, func() bool {
		clk.Step(10 * time.Second)
		var p crawlv1alpha1.Proxy
		require.NoError(t, env.Client.Get(context.Background(), key, &p))
		h := p.RecordedHealth()
		return h != nil && h.Status == metav1.ConditionFalse
	}, 10*time.Second, 5*time.Millisecond, "the new address is probed and judged, by the engine")
	require.NoError(t, env.Client.Get(context.Background(), key, &p))
	assert.Equal(t, "px-moved/h@127.0.0.23:3128", p.Status.HealthCheckedInstance, "the verdict names its instance")

	// The instance stops serving (a crashed pod, a VM gone): whatever the
	// last verdict was, the status never goes on calling it Healthy.
	reconcilerApplies(crawlv1alpha1.PhaseProvisioning, "")
	require.Eventually(t, func() bool {
		cond, _ := healthyCondition(t, env.Client, key)
		return cond != nil && cond.Status == metav1.ConditionUnknown && cond.Reason == crawlv1alpha1.ReasonNotServing
	}, 5*time.Second, 5*time.Millisecond, "a proxy that does not serve has no verdict")
	require.NoError(t, env.Client.Get(context.Background(), key, &p))
	assert.False(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady))
	assert.Empty(t, p.Status.HealthCheckedInstance)
	assert.GreaterOrEqual(t, prober.probes("127.0.0.23:3128"), int64(2), "the new address took the probes that made the verdict")
}

// TestEngineWithRealSquid wires the engine to the real prober: an External
// proxy in front of Squid comes out Healthy, one pointing at a listener that
// never answers comes out Unhealthy with Timeout.
func TestEngineWithRealSquid(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	target, roots := tlsTarget(t, http.StatusNoContent)
	sq := squid.Start(t, squid.Config{Address: "127.0.0.1", Port: freePort(t)})
	hole := blackHole(t)
	port := func(addr string) int32 {
		_, p, _ := splitHostPort(addr)
		return p
	}
	good := readyExternal(t, env.Client, ns, "squid", "127.0.0.1", port(sq.Addr))
	bad := readyExternal(t, env.Client, ns, "hole", "127.0.0.1", port(hole))
	bad.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{FailureThreshold: ptr.To[int32](1), Timeout: &metav1.Duration{Duration: 300 * time.Millisecond}}
	require.NoError(t, env.Client.Update(context.Background(), bad))

	mgr := startEngineManager(t, env)
	engine := NewEngine(Options{
		Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: NewHTTPProber(roots),
		Workers: 4, Clock: clock.RealClock{},
		Defaults: Settings{URL: target, Interval: 200 * time.Millisecond, Timeout: 2 * time.Second, FailureThreshold: 3, SuccessThreshold: 1},
	})
	require.NoError(t, mgr.Add(engine))
	run(t, mgr)

	require.Eventually(t, func() bool {
		cond, _ := healthyCondition(t, env.Client, client.ObjectKeyFromObject(good))
		return cond != nil && cond.Status == metav1.ConditionTrue
	}, 20*time.Second, 20*time.Millisecond, "a working squid is Healthy")
	require.Eventually(t, func() bool {
		cond, _ := healthyCondition(t, env.Client, client.ObjectKeyFromObject(bad))
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonTimeout
	}, 20*time.Second, 20*time.Millisecond, "a listener that never answers is Unhealthy with Timeout")

	// The metrics are well formed and counted these probes.
	assert.Positive(t, testutil.ToFloat64(probesTotal.WithLabelValues("success", ReasonProbeSucceeded)))
	assert.Positive(t, testutil.ToFloat64(probesTotal.WithLabelValues("failure", ReasonTimeout)))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(ProxiesCollector{Reader: mgr.GetClient()}))
	for _, c := range []prometheus.Collector{probesTotal, probeDuration, statusWrites, engine.LastProbeCollector()} {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems)
	}
	problems, err := testutil.CollectAndLint(ProxiesCollector{Reader: mgr.GetClient()})
	require.NoError(t, err)
	assert.Empty(t, problems)
	count, err := testutil.GatherAndCount(reg, "proxy_operator_proxies")
	require.NoError(t, err)
	assert.Positive(t, count)

	// Probe recency per proxy: one series for each probed proxy, a recent
	// time, and none for a proxy the engine has forgotten.
	lastProbes := prometheus.NewPedanticRegistry()
	require.NoError(t, lastProbes.Register(engine.LastProbeCollector()))
	probedAt := func(name string) (float64, bool) {
		families, err := lastProbes.Gather()
		require.NoError(t, err)
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["namespace"] == ns && labels["name"] == name {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	at, ok := probedAt("squid")
	require.True(t, ok, "the probed squid has a last-probe time")
	assert.InDelta(t, float64(time.Now().UnixNano())/1e9, at, 30, "the last probe was just now")
	_, ok = probedAt("hole")
	assert.True(t, ok, "a failing proxy has a last-probe time too")
	require.NoError(t, env.Client.Delete(context.Background(), bad))
	require.Eventually(t, func() bool {
		_, ok := probedAt("hole")
		return !ok
	}, 10*time.Second, 20*time.Millisecond, "a deleted proxy's series goes with it")
}

func splitHostPort(addr string) (string, int32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(port)
	return host, int32(n), err
}
