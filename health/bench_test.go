package health

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const (
	benchProxies = 10_000
	benchWorkers = 64
	benchListens = 8 // in-process CONNECT proxies the 10,000 Proxies share
)

// connectProxy starts an in-process CONNECT proxy on the loopback address
// addr for the benchmark's life.
func connectProxy(b *testing.B, addr string) string {
	b.Helper()
	p, err := cluster.StartConnectProxy(addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p.Addr
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingProber counts probes and failures of the real prober.
type countingProber struct {
	Prober
	done, failed atomic.Int64
}

func (c *countingProber) Probe(ctx context.Context, req ProbeRequest) Result {
	r := c.Prober.Probe(ctx, req)
	if !r.Success {
		c.failed.Add(1)
	}
	c.done.Add(1)
	return r
}

// BenchmarkProbes10k probes 10,000 proxies once each through the engine (its
// queue, schedule, verdict tracking and metrics, real CONNECT+TLS probes),
// and, in the same run, the same 10,000 CONNECT+TLS requests from a bare
// loop of goroutines with plain http.Transports speaking the probes' TLS
// (probeTLSConfig): the ratio is the engine's overhead over the work
// itself.
func BenchmarkProbes10k(b *testing.B) {
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	b.Cleanup(target.Close)
	roots := x509.NewCertPool()
	roots.AddCert(target.Certificate())
	proxies := make([]string, benchListens)
	for i := range proxies {
		proxies[i] = connectProxy(b, "127.0.0.1:0")
	}

	var engineTime, bareTime, engineCPU, bareCPU time.Duration
	for b.Loop() {
		// The engine: 10,000 Ready, already Healthy proxies (no status
		// writes: the verdict does not change), each probed once.
		prober := &countingProber{Prober: NewHTTPProber(roots)}
		e := NewEngine(Options{Prober: prober, Workers: benchWorkers, Clock: clock.RealClock{},
			Defaults: Settings{URL: target.URL, Interval: time.Hour, Timeout: 10 * time.Second, FailureThreshold: 3, SuccessThreshold: 1}})
		ctx, cancel := context.WithCancel(context.Background())
		cpu0, t0 := cpuTime(), time.Now()
		for i := range benchProxies {
			e.track(benchProxy(i, proxies[i%benchListens]))
		}
		done := make(chan struct{})
		go func() { e.runWorkers(ctx); close(done) }()
		for prober.done.Load() < benchProxies {
			time.Sleep(time.Millisecond)
		}
		engineTime += time.Since(t0)
		engineCPU += cpuTime() - cpu0
		cancel()
		<-done
		if n := prober.failed.Load(); n > 0 {
			b.Fatalf("%d engine probes failed", n)
		}

		// The bare loop: the same requests, no engine, and the same TLS
		// (key exchanges, resumed sessions) the engine's probes use, so the
		// ratio is the engine's own cost.
		transports := make([]*http.Transport, benchListens)
		tlsConfig := probeTLSConfig(roots)
		for i, p := range proxies {
			transports[i] = &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: p}), DisableKeepAlives: true,
				TLSClientConfig: tlsConfig}
		}
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		cpu0, t0 = cpuTime(), time.Now()
		for range benchWorkers {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < benchProxies; i = next.Add(1) - 1 {
					req, _ := http.NewRequest(http.MethodGet, target.URL, nil)
					res, err := transports[i%benchListens].RoundTrip(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
				}
			})
		}
		wg.Wait()
		bareTime += time.Since(t0)
		bareCPU += cpuTime() - cpu0
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d bare requests failed", n)
		}
	}
	probes := float64(b.N * benchProxies)
	engineRate, bareRate := probes/engineTime.Seconds(), probes/bareTime.Seconds()
	b.ReportMetric(engineRate, "engine_probes/s")
	b.ReportMetric(bareRate, "bare_probes/s")
	b.ReportMetric(float64(engineCPU.Microseconds())/probes, "engine_cpu_us/probe")
	b.ReportMetric(float64(bareCPU.Microseconds())/probes, "bare_cpu_us/probe")
	b.ReportMetric(0, "ns/op") // the per-probe figures above are the result
}

// benchProxy is a Ready, Healthy External Proxy at addr.
func benchProxy(i int, addr string) *crawlv1alpha1.Proxy {
	host, port, _ := net.SplitHostPort(addr)
	var p crawlv1alpha1.Proxy
	p.Namespace, p.Name = "bench", fmt.Sprintf("px-%05d", i)
	n, _ := strconv.Atoi(port)
	p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: host, Port: int32(n)}
	testenv.SetHealth(&p, metav1.ConditionTrue, ReasonProbeSucceeded)
	return &p
}
