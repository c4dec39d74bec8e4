package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const bareCacheEnv = "BENCH_BARE_CACHE_KUBECONFIG"

// BenchmarkOperatorMemory10k is the operator's resident memory with 10,000
// External Proxies in its cache and a Healthy verdict for each, beside a
// bare process that holds nothing but an informer cache of the same
// Proxies: the ratio is what the operator keeps beyond the objects
// themselves (its other caches, the health table, the discovery view, the
// lease store, the Go runtime's slack).
func BenchmarkOperatorMemory10k(b *testing.B) { benchMemory(b, 10_000) }

// BenchmarkOperatorMemory2500 is the same at a quarter of the fleet: with
// the 10,000 figure, the table shows how memory grows with it.
func BenchmarkOperatorMemory2500(b *testing.B) { benchMemory(b, 2_500) }

// BenchmarkOperatorMemory10kMemLimit is the 10,000 figure with GOMEMLIMIT
// at 128 MiB, as the chart sets it from a container limit of that size:
// what the Go runtime's soft limit does to the heap's headroom.
func BenchmarkOperatorMemory10kMemLimit(b *testing.B) {
	benchMemory(b, 10_000, "GOMEMLIMIT=134217728")
}

func benchMemory(b *testing.B, memoryProxies int, env ...string) {
	w := newWorld(b, cluster.Options{MarkPods: true})
	c := w.cluster.Env.Client
	ctx := context.Background()
	externals := startExternals(b)
	var opRSS, bareRSS float64
	round := 0
	for b.Loop() {
		round++
		op, metrics := w.startOperator(b, env...)
		ns := fmt.Sprintf("memory-%d", round)
		mustNamespace(b, c, ns)
		ready := watchReady(b, w.cluster, ns, memoryProxies)
		if err := forEach(memoryProxies, func(i int) error {
			return c.Create(ctx, &crawlv1alpha1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("px-%05d", i)},
				Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "eu", "tier": "bench"},
					External: externalEndpoint(externals[i%len(externals)])},
			})
		}); err != nil {
			b.Fatal(err)
		}
		ready.wait(b, 10*time.Minute, op)
		opRSS += settledRSS(b, op.PID())
		logHeap(b, metrics)
		w.heapProfile(b, fmt.Sprintf("heap%d-round%d", memoryProxies, round))
		op.Stop()

		bare := startBareCache(b, w)
		bareRSS += settledRSS(b, bare.Process.Pid)
		_ = bare.Process.Kill()
		_ = bare.Wait()
	}
	const mib = 1 << 20
	b.ReportMetric(opRSS/float64(round)/mib, "operator_rss_MiB")
	b.ReportMetric(bareRSS/float64(round)/mib, "bare_rss_MiB")
	b.ReportMetric(0, "ns/op")
}

// logHeap logs the Go heap behind the operator's RSS: what is live, and
// where the next collection will start (up to GOGC=100% above the live
// heap), which is what says how much of the RSS is headroom.
func logHeap(b *testing.B, metricsURL string) {
	b.Helper()
	families, err := cluster.ScrapeMetrics(metricsURL)
	if err != nil {
		b.Fatal(err)
	}
	gauge := func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) == 0 {
			b.Fatalf("the operator exports no %s", name)
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	const mib = 1 << 20
	b.Logf("operator heap: %.0f MiB allocated, %.0f MiB in use, next GC at %.0f MiB; %.0f goroutines",
		gauge("go_memstats_heap_alloc_bytes")/mib, gauge("go_memstats_heap_inuse_bytes")/mib, gauge("go_memstats_next_gc_bytes")/mib, gauge("go_goroutines"))
}

// settledRSS samples a process's RSS every second for 5s and returns the
// largest sample: what the process needs, not one GC's low point.
func settledRSS(b *testing.B, pid int) float64 {
	b.Helper()
	var most float64
	for range 5 {
		time.Sleep(time.Second)
		rss, err := cluster.ResidentBytes(pid)
		if err != nil {
			b.Fatal(err)
		}
		most = max(most, rss)
	}
	return most
}

// startBareCache runs this test binary again as the baseline process and
// waits until its cache has synced.
func startBareCache(b *testing.B, w *world) *exec.Cmd {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), bareCacheEnv+"="+w.cluster.Kubeconfig)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "synced\n" {
		_ = cmd.Process.Kill()
		b.Fatalf("the bare cache did not sync: %q %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd
}

// runBareCache is the baseline process: an informer cache of every Proxy,
// managedFields stripped as the operator's manager keeps them, and nothing
// else.
func runBareCache(kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := testenv.NewScheme()
	if err != nil {
		return err
	}
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := informers.GetInformer(ctx, &crawlv1alpha1.Proxy{}); err != nil {
		return err
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		return fmt.Errorf("cache did not sync")
	}
	runtime.GC()
	fmt.Println("synced")
	select {}
}
