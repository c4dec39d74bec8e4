package health

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/shard"
)

var (
	fleetInterval = flag.Duration("fleet.interval", DefaultInterval, "BenchmarkFleet: the probe interval")
	fleetSizes    = flag.String("fleet.sizes", "2500,10000,25000,50000", "BenchmarkFleet: the fleet sizes, comma-separated")
)

// fleetListeners are the in-process CONNECT proxies a simulated fleet
// shares, each on an address of its own (127.0.1.N), so that no pair of
// addresses runs out of ports for the connections each probe opens.
const fleetListeners = 64

// conntrackLinger is how long a closed TCP connection stays in a node's
// connection-tracking table (nf_conntrack_tcp_timeout_time_wait, 120 s).
const conntrackLinger = 120 * time.Second

// staticShard is a replica's share of a fixed set of members.
type staticShard struct {
	members []string
	self    string
}

func (s staticShard) Owns(key string) bool     { return shard.Owner(s.members, key) == s.self }
func (s staticShard) Changes() <-chan struct{} { return nil }

// BenchmarkFleet probes simulated fleets of 2,500 to 50,000 proxies every
// 30 s for two intervals, on one replica and on three dividing the fleet
// (three engines in this process, each with its share, real CONNECT + TLS
// probes through in-process proxies), after a first interval in which the
// engines take the fleet up as after a restart. Per point: the age of each
// proxy's last probe, sampled every second over the second interval (p99
// and max), probes per second per replica, the CPU the whole process used
// (engines, proxies and the probe target alike), the heap each replica
// holds per proxy, and each replica's connection-tracking entries (new
// connections per second × 120 s). With three replicas at 50,000 the p99
// age must stay within 35 s, and the heap per proxy flat (within 20%) from
// 10,000 to 50,000.
func BenchmarkFleet(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*fleetSizes, ",") {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
			b.Fatalf("-fleet.sizes: %q is not a fleet size", s)
		}
		sizes = append(sizes, n)
	}
	target, roots, proxies := simulatedFleet(b)
	heapPerProxy := map[[2]int]float64{}
	for _, replicas := range []int{1, 3} {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("replicas=%d/proxies=%d", replicas, n), func(b *testing.B) {
				for b.Loop() {
					got := probeFleet(b, fleet{proxies: n, replicas: replicas, interval: *fleetInterval, listeners: proxies, target: target, roots: roots})
					heapPerProxy[[2]int{replicas, n}] = got.heapPerProxy
					b.ReportMetric(got.ageP99.Seconds(), "age_p99_s")
					b.ReportMetric(got.ageMax.Seconds(), "age_max_s")
					b.ReportMetric(got.probesPerReplica, "probes/s/replica")
					b.ReportMetric(got.cpuCores, "cpu_cores")
					b.ReportMetric(got.heapPerProxy, "heap_B/proxy/replica")
					b.ReportMetric(got.conntrackPerReplica, "conntrack/replica")
					b.ReportMetric(0, "ns/op")
					// 35 s at the default interval: its 30 s, the 10% jitter, and
					// a queue that keeps up.
					bound := time.Duration(float64(35*time.Second) * fleetInterval.Seconds() / DefaultInterval.Seconds())
					if replicas == 3 && n >= 50_000 && got.ageP99 > bound {
						b.Errorf("three replicas at %d proxies: p99 probe age %s, above %s", n, got.ageP99, bound)
					}
				}
			})
		}
	}
	for _, replicas := range []int{1, 3} {
		small, large := heapPerProxy[[2]int{replicas, 10_000}], heapPerProxy[[2]int{replicas, 50_000}]
		if small > 0 && large > 1.2*small {
			b.Errorf("%d replica(s): %.0f B per proxy at 50,000 against %.0f at 10,000: memory per proxy is not flat", replicas, large, small)
		}
	}
}

// simulatedFleet starts what a simulated fleet is probed through: a probe
// target (its URL, and roots that trust it) and fleetListeners in-process
// CONNECT proxies, stopped when b ends.
func simulatedFleet(b *testing.B) (target string, roots *x509.CertPool, listeners []string) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	b.Cleanup(srv.Close)
	roots = x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	listeners = make([]string, fleetListeners)
	for i := range listeners {
		listeners[i] = connectProxy(b, fmt.Sprintf("127.0.1.%d:0", i+1))
	}
	return srv.URL, roots, listeners
}

// fleet is one point of BenchmarkFleet.
type fleet struct {
	proxies, replicas int
	interval          time.Duration
	listeners         []string
	target            string
	roots             *x509.CertPool
}

// fleetFigures are what one point measured.
type fleetFigures struct {
	ageP99, ageMax                    time.Duration
	probesPerReplica, cpuCores        float64
	heapPerProxy, conntrackPerReplica float64
}

// probeFleet runs f's replicas for two intervals and measures the second.
func probeFleet(b *testing.B, f fleet) fleetFigures {
	members := make([]string, f.replicas)
	for i := range members {
		members[i] = fmt.Sprintf("replica-%d", i)
	}
	heap0 := heapInUse()
	engines := make([]*Engine, f.replicas)
	probers := make([]*countingProber, f.replicas)
	for r := range engines {
		probers[r] = &countingProber{Prober: NewHTTPProber(f.roots)}
		engines[r] = NewEngine(Options{Prober: probers[r], Workers: benchWorkers, Clock: clock.RealClock{}, Jitter: DefaultJitter,
			Defaults: Settings{URL: f.target, Interval: f.interval, Timeout: 10 * time.Second, FailureThreshold: 3, SuccessThreshold: 1},
			Shard:    staticShard{members: members, self: members[r]}})
	}
	if f.replicas == 1 {
		engines[0].opts.Shard = nil
	}
	// Every replica follows every Proxy, as its informer would; each
	// probes its share. The fleet was probed before (a restart).
	checked := metav1.NewTime(time.Now().Add(-time.Minute)).Rfc3339Copy()
	for i := range f.proxies {
		p := benchProxy(i, f.listeners[i%len(f.listeners)])
		p.Status.LastHealthCheckTime = &checked
		for _, e := range engines {
			e.track(p)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Go(func() { e.runWorkers(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()

	start := time.Now()
	time.Sleep(f.interval) // the first interval: the fleet taken up
	heap := heapInUse() - heap0
	cpu0, t0 := cpuTime(), time.Now()
	probes0 := make([]int64, f.replicas)
	for r, p := range probers {
		probes0[r] = p.done.Load()
	}
	var ages []time.Duration
	ticker := time.NewTicker(time.Second)
	for time.Since(t0) < f.interval {
		<-ticker.C
		now := time.Now()
		for _, e := range engines {
			e.mu.RLock()
			for _, t := range e.targets {
				if !t.owned {
					continue
				}
				last := t.probedAt
				if last.IsZero() {
					last = start
				}
				ages = append(ages, now.Sub(last))
			}
			e.mu.RUnlock()
		}
	}
	ticker.Stop()
	window := time.Since(t0)
	cpu := cpuTime() - cpu0
	var busiest float64
	for r, p := range probers {
		if n := p.failed.Load(); n > 0 {
			b.Fatalf("replica %d: %d probes failed", r, n)
		}
		busiest = max(busiest, float64(p.done.Load()-probes0[r])/window.Seconds())
	}
	slices.Sort(ages)
	return fleetFigures{
		ageP99: ages[len(ages)*99/100], ageMax: ages[len(ages)-1],
		probesPerReplica: busiest, cpuCores: cpu.Seconds() / window.Seconds(),
		heapPerProxy:        float64(heap) / float64(f.proxies*f.replicas),
		conntrackPerReplica: busiest * conntrackLinger.Seconds(),
	}
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
