package health

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/lease"
)

// fakeTraffic answers ActiveLeases from a map of live leases by proxy id.
type fakeTraffic struct {
	mu     sync.Mutex
	leases map[string]int
	err    error
	asked  int
}

func (f *fakeTraffic) ActiveLeases(_ context.Context, ids []string) ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.err != nil {
		return nil, f.err
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = f.leases[id]
	}
	return out, nil
}

// AskProbe and ProbesAsked: no replica passes an ask on here.
func (f *fakeTraffic) AskProbe(context.Context, string) error { return nil }

func (f *fakeTraffic) ProbesAsked(_ context.Context, after int64) ([]string, int64, error) {
	return nil, after, nil
}

func (f *fakeTraffic) set(id string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases[id] = n
}

// TestIdleCadence: only a Healthy proxy whose last probe passed and that
// had no live lease at the last reading is probed at the idle interval;
// anything in doubt keeps its own interval.
func TestIdleCadence(t *testing.T) {
	e := NewEngine(Options{IdleInterval: 2 * time.Minute}) // no jitter: exact
	settings := Settings{Interval: 30 * time.Second}
	for _, c := range []struct {
		name       string
		verdict    Verdict
		lastPassed bool
		idle       bool
		settings   Settings
		want       time.Duration
	}{
		{"idle and healthy", Healthy, true, true, settings, 2 * time.Minute},
		{"busy", Healthy, true, false, settings, 30 * time.Second},
		{"idle, but its last probe failed", Healthy, false, true, settings, 30 * time.Second},
		{"idle, Unhealthy", Unhealthy, false, true, settings, 30 * time.Second},
		{"idle, no verdict yet", Unknown, true, true, settings, UndecidedRetry},
		{"idle, its own interval longer than the idle one", Healthy, true, true, Settings{Interval: 5 * time.Minute}, 5 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, e.nextProbe(c.settings, c.verdict, e.idleCadence(c.settings, c.verdict, c.lastPassed, c.idle)))
		})
	}
	off := NewEngine(Options{})
	assert.Equal(t, 30*time.Second, off.nextProbe(settings, Healthy, off.idleCadence(settings, Healthy, true, true)), "no idle interval: every proxy at its own")
}

// TestTrafficReadings: one batched reading marks this replica's proxies
// idle or busy; a proxy that turns busy is due an interval after its last
// probe (at once when that has passed); a store that does not answer makes
// every proxy busy; a failed tunnel's ask probes at once, once per
// ProbeSoonGap.
func TestTrafficReadings(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	traffic := &fakeTraffic{leases: map[string]int{"ns/busy": 2}}
	e := NewEngine(Options{Clock: clk, IdleInterval: 2 * time.Minute, Traffic: traffic, Defaults: Settings{Interval: 30 * time.Second}})
	defer e.queue.ShutDown()
	settings := unique.Make(Settings{URL: "https://probe.test/", Interval: 30 * time.Second})
	keys := map[string]types.NamespacedName{}
	for _, name := range []string{"busy", "idle", "late", "other"} {
		keys[name] = types.NamespacedName{Namespace: "ns", Name: name}
		tg := &target{owned: name != "other", probeTarget: probeTarget{settings: settings}, lastProbe: start.Add(-5 * time.Second)}
		tg.tracker.verdict, tg.tracker.lastSuccess = Healthy, true
		e.targets[keys[name]] = tg
	}
	e.targets[keys["late"]].lastProbe = start.Add(-time.Minute)

	ctx := context.Background()
	e.readTraffic(ctx)
	assert.Equal(t, 1, traffic.asked, "one reading for the whole share")
	assert.False(t, e.targets[keys["busy"]].idle)
	assert.True(t, e.targets[keys["idle"]].idle)
	assert.True(t, e.targets[keys["late"]].idle)
	assert.False(t, e.targets[keys["other"]].idle, "another replica's proxy is not this one's to pace")
	assert.Zero(t, e.queue.Len(), "nothing turned busy: nothing rescheduled")

	// "late" (probed a minute ago) and "idle" (5s ago) get leases.
	traffic.set("ns/late", 1)
	traffic.set("ns/idle", 1)
	e.readTraffic(ctx)
	require.Equal(t, 1, e.queue.Len(), "the proxy whose last probe is more than an interval old is due at once")
	item, _ := e.queue.Get()
	assert.Equal(t, keys["late"], item.key)
	e.queue.Done(item)
	clk.Step(25 * time.Second) // "idle" is due 30s after its last probe
	require.Eventually(t, func() bool { return e.queue.Len() == 1 }, 5*time.Second, time.Millisecond)
	item, _ = e.queue.Get()
	assert.Equal(t, keys["idle"], item.key)
	e.queue.Done(item)

	traffic.set("ns/late", 0)
	traffic.mu.Lock()
	traffic.err = errors.New("redis: connection refused")
	traffic.mu.Unlock()
	e.readTraffic(ctx)
	for name, key := range keys {
		assert.False(t, e.targets[key].idle, "%s: a store that does not answer makes every proxy busy", name)
	}

	// A tunnel that could not reach "busy", last probed 30s ago.
	probeSoon := func(key types.NamespacedName) bool { _, asked := e.probeSoon(key, viaThisReplica); return asked }
	assert.True(t, probeSoon(keys["busy"]))
	assert.Equal(t, 1, e.queue.Len())
	e.targets[keys["busy"]].lastProbe = clk.Now() // its probe starts
	assert.False(t, probeSoon(keys["busy"]), "probed within ProbeSoonGap: not again")
	assert.False(t, probeSoon(keys["other"]), "another replica probes it")
	assert.False(t, probeSoon(types.NamespacedName{Namespace: "ns", Name: "gone"}))
}

// countedAsks counts the asks passed on to a lease store, once the store
// has each: a test that waits for the count may read the ask at once.
type countedAsks struct {
	*lease.MemoryStore
	asks atomic.Int64
}

func (c *countedAsks) AskProbe(ctx context.Context, proxy string) error {
	err := c.MemoryStore.AskProbe(ctx, proxy)
	c.asks.Add(1)
	return err
}

// TestAsksReachTheReplicaThatProbes: a tunnel on a replica that does not
// probe the proxy passes its ask on through the lease store, once per
// ProbeSoonGap; the replica that probes it reads the ask within
// ProbeAskPoll and probes it, and a replica that does not probe it does
// nothing with it.
func TestAsksReachTheReplicaThatProbes(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	store := &countedAsks{MemoryStore: lease.NewMemoryStore(clk)}
	key := types.NamespacedName{Namespace: "ns", Name: "px"}
	settings := unique.Make(Settings{URL: "https://probe.test/", Interval: 30 * time.Second})
	replica := func(owned bool) *Engine {
		e := NewEngine(Options{Clock: clk, Traffic: store, Defaults: Settings{Interval: 30 * time.Second}})
		t.Cleanup(e.queue.ShutDown)
		tg := &target{owned: owned, probeTarget: probeTarget{settings: settings}, lastProbe: start.Add(-time.Minute)}
		tg.tracker.verdict, tg.tracker.lastSuccess = Healthy, true
		e.targets[key] = tg
		return e
	}
	tunnels, prober, bystander := replica(false), replica(true), replica(false)
	viaStore := probesAsked.WithLabelValues(viaLeaseStore)
	before := testutil.ToFloat64(viaStore)

	ctx := context.Background()
	var proberAt, bystanderAt int64
	readAsks := func() {
		t.Helper()
		var err error
		proberAt, err = prober.readAsks(ctx, proberAt)
		require.NoError(t, err)
		bystanderAt, err = bystander.readAsks(ctx, bystanderAt)
		require.NoError(t, err)
	}
	readAsks()

	tunnels.AskProbe(key)
	require.Eventually(t, func() bool { return store.asks.Load() == 1 }, 5*time.Second, time.Millisecond, "passed on to the store")
	tunnels.AskProbe(key)
	assert.Zero(t, tunnels.queue.Len(), "the tunnels' replica does not probe it")

	clk.Step(ProbeAskPoll)
	readAsks()
	require.Equal(t, 1, prober.queue.Len(), "the replica that probes it reads the ask")
	item, _ := prober.queue.Get()
	assert.Equal(t, key, item.key)
	prober.queue.Done(item)
	assert.Equal(t, before+1, testutil.ToFloat64(viaStore))
	assert.Zero(t, bystander.queue.Len(), "a replica that does not probe it leaves it alone")
	assert.Equal(t, int64(1), store.asks.Load(), "a second failed tunnel within ProbeSoonGap passes nothing on")

	// The probe starts; a new ask within ProbeSoonGap of it asks for none.
	prober.targets[key].lastProbe = clk.Now()
	clk.Step(ProbeSoonGap / 2)
	tunnels.AskProbe(key)
	assert.Equal(t, int64(1), store.asks.Load(), "within ProbeSoonGap of the last one")
	clk.Step(ProbeSoonGap / 2)
	tunnels.AskProbe(key)
	require.Eventually(t, func() bool { return store.asks.Load() == 2 }, 5*time.Second, time.Millisecond, "a ProbeSoonGap later it is passed on again")
	clk.Step(ProbeAskPoll)
	readAsks()
	require.Equal(t, 1, prober.queue.Len(), "and probed again")
	assert.Equal(t, before+2, testutil.ToFloat64(viaStore))

	// On the replica that probes it, an ask probes at once, through no store.
	item, _ = prober.queue.Get()
	prober.queue.Done(item)
	clk.Step(ProbeSoonGap)
	prober.AskProbe(key)
	assert.Equal(t, 1, prober.queue.Len())
	assert.Equal(t, int64(2), store.asks.Load())
}
