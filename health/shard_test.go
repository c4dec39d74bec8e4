package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/shard"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// probeLog records every probe: which replica, of which address, when it
// began and ended.
type probeLog struct {
	mu     sync.Mutex
	probes []probeSpan
}

type probeSpan struct {
	replica    int
	addr       string
	start, end time.Time
}

// replicaProber passes every probe of the addresses it is told of after a
// short wait (so that two replicas probing at once would overlap), and
// logs it.
type replicaProber struct {
	replica int
	log     *probeLog
	addrs   map[string]bool
}

func (p replicaProber) Probe(ctx context.Context, req ProbeRequest) Result {
	if !p.addrs[req.ProxyAddr] {
		return Result{Reason: ReasonConnectRefused, Message: "another test's proxy"}
	}
	start := time.Now()
	select {
	case <-time.After(30 * time.Millisecond):
	case <-ctx.Done():
		return Result{Reason: ReasonTimeout, Message: "cancelled"}
	}
	p.log.mu.Lock()
	p.log.probes = append(p.log.probes, probeSpan{p.replica, req.ProxyAddr, start, time.Now()})
	p.log.mu.Unlock()
	return pass
}

// spans are the probes logged so far.
func (l *probeLog) spans() []probeSpan {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]probeSpan(nil), l.probes...)
}

// severable is a Lease client whose every call fails once cut: the
// replica is cut off from the API server, as a partition or a crash
// leaves it, and cannot delete its Lease on the way out.
type severable struct {
	coordinationv1client.LeasesGetter
	cut *atomic.Bool
}

func (s severable) Leases(namespace string) coordinationv1client.LeaseInterface {
	return severedLeases{s.LeasesGetter.Leases(namespace), s.cut}
}

type severedLeases struct {
	coordinationv1client.LeaseInterface
	cut *atomic.Bool
}

var errSevered = errors.New("connection refused: the replica is cut off")

func (s severedLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if s.cut.Load() {
		return nil, errSevered
	}
	return s.LeaseInterface.Get(ctx, name, opts)
}

func (s severedLeases) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if s.cut.Load() {
		return nil, errSevered
	}
	return s.LeaseInterface.List(ctx, opts)
}

func (s severedLeases) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if s.cut.Load() {
		return nil, errSevered
	}
	return s.LeaseInterface.Update(ctx, l, opts)
}

func (s severedLeases) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if s.cut.Load() {
		return errSevered
	}
	return s.LeaseInterface.Delete(ctx, name, opts)
}

// TestShardedReplicasProbeEachProxyOnce runs three replicas' engines, each
// with its own cache and shard membership, over 45 proxies. Every proxy is
// probed by one replica at a time and recorded by it alone, every replica
// knows every verdict, and when one replica is cut off from the API server
// the others take up its share within one probe interval while it stops.
func TestShardedReplicasProbeEachProxyOnce(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	const proxies, interval = 45, 5 * time.Second
	addrs := map[string]bool{}
	var keys []types.NamespacedName
	for i := range proxies {
		ip := fmt.Sprintf("127.0.3.%d", i+1)
		p := readyExternal(t, env.Client, ns, fmt.Sprintf("px-%d", i), ip, 3128)
		addrs[ip+":3128"] = true
		keys = append(keys, client.ObjectKeyFromObject(p))
	}
	typed, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	log := &probeLog{}
	var engines []*Engine
	var cut []*atomic.Bool
	for replica := range 3 {
		severed := &atomic.Bool{}
		cut = append(cut, severed)
		member, err := shard.New(shard.Options{
			Leases: severable{typed.CoordinationV1(), severed}, Namespace: ns, Group: "probes", Identity: fmt.Sprintf("replica-%d", replica),
			LeaseDuration: 2 * time.Second, RenewDeadline: 1200 * time.Millisecond, RenewInterval: 250 * time.Millisecond, HandoverDelay: 500 * time.Millisecond,
		})
		require.NoError(t, err)
		mgr := startEngineManager(t, env)
		engine := NewEngine(Options{
			Cache: mgr.GetCache(), Client: mgr.GetClient(), Prober: replicaProber{replica, log, addrs}, Workers: 8, Clock: clock.RealClock{},
			Jitter:   DefaultJitter,
			Defaults: Settings{URL: "https://127.0.0.1/", Interval: interval, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1},
			Shard:    member,
		})
		require.False(t, engine.NeedLeaderElection(), "a sharded engine runs on every replica")
		require.NoError(t, mgr.Add(member))
		require.NoError(t, mgr.Add(engine))
		run(t, mgr)
		engines = append(engines, engine)
	}

	// Every proxy's verdict is recorded, and every replica knows it.
	require.Eventually(t, func() bool {
		for _, key := range keys {
			for _, e := range engines {
				if v, _ := e.Verdict(key); v != Healthy {
					return false
				}
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "every replica knows every verdict, its own share's and the others'")

	// Steady state: until each proxy is probed twice more, each is
	// probed by one replica.
	settled := time.Now()
	var owners map[string]map[int]bool
	shares := map[int]int{}
	require.Eventually(t, func() bool {
		owners, shares = map[string]map[int]bool{}, map[int]int{}
		probes := map[string]int{}
		for _, s := range log.spans() {
			if s.start.After(settled) {
				if owners[s.addr] == nil {
					owners[s.addr] = map[int]bool{}
				}
				if !owners[s.addr][s.replica] {
					shares[s.replica]++
				}
				owners[s.addr][s.replica] = true
				probes[s.addr]++
			}
		}
		for addr := range addrs {
			if probes[addr] < 2 {
				return false
			}
		}
		return true
	}, 4*interval, 50*time.Millisecond, "every proxy is probed every interval")
	require.Len(t, owners, proxies, "every proxy is probed")
	for addr, by := range owners {
		require.Len(t, by, 1, "%s is probed by one replica: %v", addr, by)
	}
	require.Len(t, shares, 3, "all three replicas probe a share: %v", shares)

	// Verdicts are the health engine's, under its one field manager.
	var p crawlv1alpha1.Proxy
	require.NoError(t, env.Client.Get(context.Background(), keys[0], &p))
	require.True(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionHealthy))
	var managers []string
	for _, f := range p.ManagedFields {
		if f.Subresource == "status" {
			managers = append(managers, f.Manager)
		}
	}
	assert.Contains(t, managers, crawlv1alpha1.FieldManagerHealth)

	// Replica 2 is cut off: it stops at its renew deadline, and the others
	// take up its share within one interval.
	var theirs []string
	for addr, by := range owners {
		if by[2] {
			theirs = append(theirs, addr)
		}
	}
	require.NotEmpty(t, theirs)
	cutAt := time.Now()
	cut[2].Store(true)
	require.Eventually(t, func() bool {
		taken := map[string]bool{}
		for _, s := range log.spans() {
			if s.replica != 2 && s.start.After(cutAt) {
				taken[s.addr] = true
			}
		}
		for _, addr := range theirs {
			if !taken[addr] {
				return false
			}
		}
		return true
	}, 3*interval, 20*time.Millisecond, "the others take up the cut-off replica's share")
	handover := map[string]time.Time{}
	var lastOfCut time.Time
	for _, s := range log.spans() {
		if s.replica == 2 && s.end.After(lastOfCut) {
			lastOfCut = s.end
		}
		if s.replica != 2 && s.start.After(cutAt) {
			if at, ok := handover[s.addr]; !ok || s.start.Before(at) {
				handover[s.addr] = s.start
			}
		}
	}
	var slowest time.Duration
	for _, addr := range theirs {
		slowest = max(slowest, handover[addr].Sub(cutAt))
	}
	t.Logf("the cut-off replica's last probe ended %s after the cut; its %d proxies were all probed again %s after it",
		lastOfCut.Sub(cutAt).Round(time.Millisecond), len(theirs), slowest.Round(time.Millisecond))
	assert.LessOrEqual(t, slowest, interval, "a replica's share is taken up within one probe interval")

	// At no time were two replicas probing one proxy.
	byAddr := map[string][]probeSpan{}
	for _, s := range log.spans() {
		byAddr[s.addr] = append(byAddr[s.addr], s)
	}
	for addr, spans := range byAddr {
		for i, a := range spans {
			for _, b := range spans[i+1:] {
				if a.replica != b.replica {
					require.False(t, a.start.Before(b.end) && b.start.Before(a.end), "%s probed by replicas %d and %d at once", addr, a.replica, b.replica)
				}
			}
		}
	}
}

// toggleShard owns everything or nothing, as a test says, and tells of a
// change only when the test sends one: a Lease that lapses between two
// renewals stops owning before the member has said so.
type toggleShard struct {
	owns    atomic.Bool
	changes chan struct{}
}

func (s *toggleShard) Owns(string) bool         { return s.owns.Load() }
func (s *toggleShard) Changes() <-chan struct{} { return s.changes }
func (s *toggleShard) announce()                { s.changes <- struct{}{} }

// TestALapsedShareIsTakenUpAgain: a proxy whose probe comes due while this
// replica's share has lapsed, unannounced, is not probed; once the share
// is back and announced, it is probed again rather than forgotten.
func TestALapsedShareIsTakenUpAgain(t *testing.T) {
	sh := &toggleShard{changes: make(chan struct{}, 1)}
	sh.owns.Store(true)
	probes := &startLog{}
	clk := clocktesting.NewFakeClock(time.Now())
	e := NewEngine(Options{Prober: probes, Workers: 2, Clock: clk, Shard: sh,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 30 * time.Second, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1}})
	p := benchProxy(0, "127.0.0.1:3128")
	key := client.ObjectKeyFromObject(p)
	e.track(p)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.runWorkers(ctx) })
	wg.Go(func() { e.followShard(ctx) })
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return probes.count() == 1 }, 5*time.Second, time.Millisecond, "a new proxy is probed at once")

	owned := func() bool {
		e.mu.RLock()
		defer e.mu.RUnlock()
		return e.targets[key].owned
	}
	sh.owns.Store(false) // lapsed, unannounced
	require.Eventually(t, func() bool {
		clk.Step(time.Second)
		return !owned()
	}, 5*time.Second, time.Millisecond, "the probe that came due finds the share lapsed and hands the proxy over")
	require.Equal(t, 1, probes.count(), "no probe while the share is lapsed")

	sh.owns.Store(true)
	sh.announce()
	require.Eventually(t, func() bool {
		clk.Step(time.Second)
		return probes.count() == 2
	}, 5*time.Second, time.Millisecond, "taken up again, the proxy is probed")
}

// TestAGainedProxyThatStoppedServingIsSettled: a proxy that stops serving
// while another replica owns it keeps the Ready its owner recorded until
// its new owner takes it up: then the new owner writes what is true
// (Healthy Unknown, not serving; Ready False), though it has nothing to
// probe.
func TestAGainedProxyThatStoppedServingIsSettled(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	p := readyManaged(t, env.Client, ns, "gone-owner", "127.0.3.201")
	key := client.ObjectKeyFromObject(p)
	updateProxy(t, env.Client, key, func(p *crawlv1alpha1.Proxy) error {
		testenv.SetHealth(p, metav1.ConditionTrue, ReasonProbeSucceeded)
		p.Status.Phase = crawlv1alpha1.PhaseReplacing // its instance is going; its owner is gone
		return env.Client.Status().Update(context.Background(), p)
	})
	sh := &toggleShard{changes: make(chan struct{}, 1)}
	e := NewEngine(Options{Client: env.Client, Prober: &startLog{}, Workers: 2, Clock: clock.RealClock{}, Shard: sh,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 30 * time.Second, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1}})
	e.track(get(t, env.Client, key))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { e.runWorkers(ctx) })
	wg.Go(func() { e.followShard(ctx) })
	defer func() { cancel(); wg.Wait() }()
	require.True(t, meta.IsStatusConditionTrue(get(t, env.Client, key).Status.Conditions, crawlv1alpha1.ConditionReady), "not its to settle yet")

	sh.owns.Store(true)
	sh.announce()
	require.Eventually(t, func() bool {
		got := get(t, env.Client, key)
		return meta.IsStatusConditionFalse(got.Status.Conditions, crawlv1alpha1.ConditionReady) &&
			meta.FindStatusCondition(got.Status.Conditions, crawlv1alpha1.ConditionHealthy).Reason == crawlv1alpha1.ReasonNotServing
	}, 10*time.Second, 20*time.Millisecond, "the new owner records that it does not serve")
}

func get(t *testing.T, c client.Client, key types.NamespacedName) *crawlv1alpha1.Proxy {
	t.Helper()
	var p crawlv1alpha1.Proxy
	require.NoError(t, c.Get(context.Background(), key, &p))
	return &p
}
