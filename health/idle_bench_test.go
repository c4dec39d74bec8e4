package health

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// BenchmarkIdleFleet probes 10,000 simulated proxies of which a tenth carry
// leases, with an idle interval four times the interval (--health-idle-
// interval; the interval is a third of -fleet.interval, so the run takes
// about 90 s), on one replica, real CONNECT + TLS probes through in-process
// proxies. After a warm-up of one interval and one idle interval it
// measures one idle interval: probes per second against the full rate
// (every proxy every interval; 0.325 expected: 0.1 + 0.9/4), the p99 age of
// the busy proxies' and the idle proxies' last probes, and the connection-
// tracking entries. Busy proxies must keep their interval (p99 within
// 1.2×), idle ones the idle interval, and the rate must be under half the
// full one.
func BenchmarkIdleFleet(b *testing.B) {
	const proxies, busyEvery = 10_000, 10
	interval := *fleetInterval / 3
	idleInterval := 4 * interval
	target, roots, listeners := simulatedFleet(b)
	for b.Loop() {
		got := probeIdleFleet(b, proxies, busyEvery, interval, idleInterval, listeners, target, roots)
		full := float64(proxies) / interval.Seconds()
		b.ReportMetric(got.probesPerSecond, "probes/s")
		b.ReportMetric(got.probesPerSecond/full, "x_full_rate")
		b.ReportMetric(got.busyAgeP99.Seconds(), "age_busy_p99_s")
		b.ReportMetric(got.idleAgeP99.Seconds(), "age_idle_p99_s")
		b.ReportMetric(got.probesPerSecond*conntrackLinger.Seconds(), "conntrack")
		b.ReportMetric(0, "ns/op")
		if bound := time.Duration(1.2 * float64(interval)); got.busyAgeP99 > bound {
			b.Errorf("busy proxies: p99 probe age %s, above %s", got.busyAgeP99, bound)
		}
		if bound := time.Duration(1.2 * float64(idleInterval)); got.idleAgeP99 > bound {
			b.Errorf("idle proxies: p99 probe age %s, above %s", got.idleAgeP99, bound)
		}
		if got.probesPerSecond > full/2 {
			b.Errorf("%.0f probes/s, more than half the full rate (%.0f/s): idle proxies are not probed less", got.probesPerSecond, full)
		}
	}
}

// idleFigures are what one run of BenchmarkIdleFleet measured.
type idleFigures struct {
	probesPerSecond        float64
	busyAgeP99, idleAgeP99 time.Duration
}

func probeIdleFleet(b *testing.B, proxies, busyEvery int, interval, idleInterval time.Duration, listeners []string, target string, roots *x509.CertPool) idleFigures {
	traffic := &fakeTraffic{leases: map[string]int{}}
	busy := map[types.NamespacedName]bool{}
	prober := &countingProber{Prober: NewHTTPProber(roots)}
	e := NewEngine(Options{Prober: prober, Workers: benchWorkers, Clock: clock.RealClock{}, Jitter: DefaultJitter,
		Defaults:     Settings{URL: target, Interval: interval, Timeout: 10 * time.Second, FailureThreshold: 3, SuccessThreshold: 1},
		IdleInterval: idleInterval, Traffic: traffic})
	checked := metav1.NewTime(time.Now().Add(-time.Minute)).Rfc3339Copy()
	for i := range proxies {
		p := benchProxy(i, listeners[i%len(listeners)])
		p.Status.LastHealthCheckTime = &checked
		if i%busyEvery == 0 {
			traffic.set(p.Namespace+"/"+p.Name, 1)
			busy[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = true
		}
		e.track(p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	e.readTraffic(ctx)
	wg.Go(func() { e.followTraffic(ctx) })
	wg.Go(func() { e.runWorkers(ctx) })
	defer func() { cancel(); wg.Wait() }()

	time.Sleep(interval + idleInterval) // taken up, then settled into its cadence
	probes0, t0 := prober.done.Load(), time.Now()
	var busyAges, idleAges []time.Duration
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for time.Since(t0) < idleInterval {
		<-ticker.C
		now := time.Now()
		e.mu.RLock()
		for key, t := range e.targets {
			if t.probedAt.IsZero() {
				continue
			}
			if busy[key] {
				busyAges = append(busyAges, now.Sub(t.probedAt))
			} else {
				idleAges = append(idleAges, now.Sub(t.probedAt))
			}
		}
		e.mu.RUnlock()
	}
	window := time.Since(t0)
	if n := prober.failed.Load(); n > 0 {
		b.Fatalf("%d probes failed", n)
	}
	slices.Sort(busyAges)
	slices.Sort(idleAges)
	return idleFigures{
		probesPerSecond: float64(prober.done.Load()-probes0) / window.Seconds(),
		busyAgeP99:      busyAges[len(busyAges)*99/100], idleAgeP99: idleAges[len(idleAges)*99/100],
	}
}
