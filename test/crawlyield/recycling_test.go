package crawlyield

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// A cloud's addresses: host n of the block is dirty (burned by someone
// else before the fleet got it: the sites refuse it for good) when
// n%dirtyEvery == 1, a quarter of them, as lantern_aws found blocked IPs
// coming back on new proxies.
const (
	dirtyEvery  = 4
	cloudHosts  = 250
	cloudReuse  = 0.5 // the chance a new instance gets a released address
	burnedScope = "cloud"
)

func dirty(block, n int) string { return fmt.Sprintf("127.0.%d.%d", block, n) }

// recyclingRules are the recycling benchmark's sites: the base rules, and
// three of them refuse every dirty address of the cloud's block (403, an
// IP banned for good); the fourth refuses none.
func recyclingRules(block int) []simweb.Rules {
	base := simweb.Rules{RatePerSecond: 2, Burst: 4, MaxConcurrent: 2, BanAfter: 5,
		BanWindow: simweb.Duration(30 * time.Second), BanFor: simweb.Duration(time.Hour), Latency: simweb.Duration(20 * time.Millisecond)}
	var blocked []string
	for n := 1; n <= cloudHosts; n += dirtyEvery {
		blocked = append(blocked, dirty(block, n))
	}
	banning := base
	banning.Blocked = blocked
	return []simweb.Rules{banning, banning, banning, base}
}

// cloud hands out the addresses of a block as a provider hands IPs to new
// VMs: a released address goes back to a pool, and with chance reuse it
// is what the next VM gets (a random one of the pool); otherwise a never
// used one.
type cloud struct {
	mu       sync.Mutex
	block    int
	next     int
	released []string
	rng      *rand.Rand
}

func newCloud(block int) *cloud { return &cloud{block: block, rng: rand.New(rand.NewPCG(35, 1))} }

func (c *cloud) allocate() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.released) > 0 && c.rng.Float64() < cloudReuse {
		i := c.rng.IntN(len(c.released))
		ip := c.released[i]
		c.released = slices.Delete(c.released, i, i+1)
		return ip
	}
	c.next++
	return dirty(c.block, c.next)
}

func (c *cloud) release(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, ip)
}

// recyclingFleet is n proxies on the cloud, each an in-process CONNECT
// proxy leaving from its own address, in discovery's view as the operator
// would show them; recycle replaces the banned ones as the ban judge and
// the Proxy reconciler do, without the API server between them.
type recyclingFleet struct {
	cloud  *cloud
	view   *broker.View
	store  lease.Store
	memory bool // the burned-IP memory: a new instance on a burned address is rerolled

	mu      sync.Mutex
	slots   []*fleetSlot
	retired int
	rerolls int
}

type fleetSlot struct {
	name  string
	ip    string
	proxy *cluster.ConnectProxy
	since time.Time
}

func startFleet(t testing.TB, c *cloud, store lease.Store, view *broker.View, n int, memory bool) *recyclingFleet {
	t.Helper()
	f := &recyclingFleet{cloud: c, view: view, store: store, memory: memory}
	for i := range n {
		s := &fleetSlot{name: fmt.Sprintf("p%02d", i)}
		require.NoError(t, f.start(s, c.allocate()))
		f.slots = append(f.slots, s)
	}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, s := range f.slots {
			s.proxy.Close()
		}
	})
	return f
}

// start runs slot s's proxy on ip and shows it Ready and Healthy there.
func (f *recyclingFleet) start(s *fleetSlot, ip string) error {
	proxy, err := cluster.StartConnectProxy(net.JoinHostPort(ip, "3128"))
	if err != nil {
		return err
	}
	s.ip, s.proxy, s.since = ip, proxy, time.Now()
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: s.name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"fleet": "bench"},
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "ProbeSucceeded")
	f.view.Handler().OnAdd(p, false)
	return nil
}

// recycle judges the fleet once (bans.Decide on the outcome memory's
// blocks, 3 hosts within a minute, the pool default's share) and replaces
// each banned proxy: its address burned (with the memory), released to
// the cloud, and a new one taken, rerolled at most 3 times while it is
// burned.
func (f *recyclingFleet) recycle(ctx context.Context) error {
	now := time.Now()
	blocks, err := f.store.Blocks(ctx, now.Add(-lease.OutcomeRetention))
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	subjects := make([]bans.Subject, len(f.slots))
	for i, s := range f.slots {
		subjects[i] = bans.Subject{Key: types.NamespacedName{Namespace: "crawl", Name: s.name}, Group: "crawl/bench",
			Hosts: crawlv1alpha1.DefaultBanHosts, Window: time.Minute, Since: s.since}
	}
	verdicts, _, _ := bans.Decide(subjects, blocks, now, bans.DefaultMaxBlockedShare, nil)
	for _, s := range f.slots {
		if !verdicts[types.NamespacedName{Namespace: "crawl", Name: s.name}].Banned {
			continue
		}
		if f.memory {
			if err := f.store.BurnIP(ctx, burnedScope, s.ip, time.Hour); err != nil {
				return err
			}
		}
		s.proxy.Close()
		f.cloud.release(s.ip)
		ip := f.cloud.allocate()
		for try := 0; f.memory && try < controllers.DefaultMaxBurnedIPRerolls; try++ {
			until, err := f.store.BurnedUntil(ctx, burnedScope, ip)
			if err != nil {
				return err
			}
			if until.IsZero() {
				break
			}
			f.rerolls++
			f.cloud.release(ip)
			ip = f.cloud.allocate()
		}
		if err := f.start(s, ip); err != nil {
			return err
		}
		f.retired++
	}
	return nil
}

// BenchmarkCrawlYieldRecycling: the fleet on a cloud that hands out burned
// addresses, crawled politely by 64 workers through the gateway for 20 s
// a way, three ways in the same run: a fleet that keeps its proxies
// (`static`), one recycling the proxies three sites block
// (`recycling`), and one that also never serves an address it retired for
// bans (`recyclingMemory`); beside the oracle, the most the sites' rules
// allow 20 clean addresses.
func BenchmarkCrawlYieldRecycling(b *testing.B) {
	logf.SetLogger(logr.Discard())
	const (
		block   = 64
		proxies = 20
		perSite = 2000
		workers = 64
		runFor  = 20 * time.Second
	)
	w := &web{tls: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}}
	for i, r := range recyclingRules(block) {
		s, err := simweb.StartOn(fmt.Sprintf("127.0.%d.%d:443", block+1, i+1), true, r)
		require.NoError(b, err)
		b.Cleanup(s.Close)
		w.tls.RootCAs.AddCert(s.Certificate())
		w.sites = append(w.sites, s)
	}
	urls := urlsOf(w, perSite)
	clean := make([]string, proxies)
	for i := range clean {
		clean[i] = fmt.Sprintf("127.0.%d.%d", block+2, i+1)
	}
	best := 0
	for _, s := range w.sites {
		r := s.Rules
		r.Blocked = nil
		best += simweb.Oracle(r, clean, runFor, perSite)
	}
	// A warm-up crawl first: the first crawl of a process is the slowest
	// by far (connections, TLS, the runtime), and no way should pay for it.
	{
		store, view := lease.NewMemoryStore(nil), broker.NewView(nil, "operator-ns")
		p := startViewProduct(b, view, broker.Politeness{Policies: publishedPolicies(b, w), Adaptive: true}, store, w.tls.RootCAs)
		startFleet(b, newCloud(block+2), store, view, proxies, false)
		crawl(w, urls, workers, 3*time.Second, throughGateway(w, p, workers, false))
	}
	for _, way := range []struct {
		name            string
		recycle, memory bool
	}{{"static", false, false}, {"recycling", true, false}, {"recyclingMemory", true, true}} {
		b.Run(way.name, func(b *testing.B) {
			var r result
			var f *recyclingFleet
			for b.Loop() {
				store := lease.NewMemoryStore(nil)
				view := broker.NewView(nil, "operator-ns")
				p := startViewProduct(b, view, broker.Politeness{Policies: publishedPolicies(b, w), Adaptive: true}, store, w.tls.RootCAs)
				f = startFleet(b, newCloud(block), store, view, proxies, way.memory)
				ctx, cancel := context.WithCancel(context.Background())
				var judged sync.WaitGroup
				if way.recycle {
					judged.Go(func() {
						for ctx.Err() == nil {
							if err := f.recycle(ctx); err != nil && ctx.Err() == nil {
								b.Errorf("recycling: %v", err)
								return
							}
							select {
							case <-ctx.Done():
							case <-time.After(250 * time.Millisecond):
							}
						}
					})
				}
				r = crawl(w, urls, workers, runFor, throughGateway(w, p, workers, false))
				cancel()
				judged.Wait()
			}
			b.Logf("%s: %d pages, %d wasted of %d requests, %d held by the gateway, %d retired, %d rerolled", way.name, r.pages, r.wasted, r.requests, r.held, f.retired, f.rerolls)
			b.ReportMetric(r.pagesPerMinute(), way.name+"_pages/min")
			b.ReportMetric(float64(best)/runFor.Minutes(), "bare_pages/min")
			b.ReportMetric(100*r.wastedShare(), way.name+"_wasted_%")
			b.ReportMetric(float64(f.retired), way.name+"_retired")
			b.ReportMetric(float64(f.rerolls), way.name+"_rerolled")
		})
	}
}
