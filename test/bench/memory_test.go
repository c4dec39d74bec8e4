package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

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

// steadyWindow is the --health-interval the benchmarks' operator runs
// with, plus its jitter of 10%: every proxy is probed once within it.
const steadyWindow = 33 * time.Second

// BenchmarkOperatorMemory10kGOGC100 is the 10,000 figure at Go's default
// GOGC rather than the operator's 50: the collector runs when the heap has
// doubled its live data, not grown by half. The two rows' memory and
// steady CPU are the trade the default makes.
func BenchmarkOperatorMemory10kGOGC100(b *testing.B) {
	benchMemory(b, 10_000, "GOGC=100")
}

func benchMemory(b *testing.B, memoryProxies int, env ...string) {
	w := newWorld(b, cluster.Options{MarkPods: true})
	c := w.cluster.Env.Client
	ctx := context.Background()
	externals := startExternals(b)
	var op, bare cluster.ProcessMemory // summed over rounds
	var steadyCPU, steadyWall time.Duration
	round := 0
	for b.Loop() {
		round++
		opProc, metrics := w.startOperator(b, env...)
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
		ready.wait(b, opProc)
		// The operator's CPU over one probe interval and its jitter from
		// here, its RSS sampled at the start of it: probing every proxy
		// once and collecting what that allocates, which GOGC trades
		// against memory. (A shorter window sees more or fewer of the
		// probes the bring-up bunched together, run by run.)
		self := map[string]int{"operator": opProc.PID()}
		cpu0, t0 := cpuTime(b, self), time.Now()
		op.Add(settledRSS(b, opProc.PID()))
		time.Sleep(time.Until(t0.Add(steadyWindow)))
		steadyCPU += cpuTime(b, self) - cpu0
		steadyWall += time.Since(t0)
		logHeap(b, metrics)
		w.heapProfile(b, fmt.Sprintf("heap%d-round%d", memoryProxies, round))
		opProc.Stop()

		bareProc := startBareCache(b, w)
		bare.Add(settledRSS(b, bareProc.Process.Pid))
		_ = bareProc.Process.Kill()
		_ = bareProc.Wait()
	}
	// RSS is the target's figure; its parts say whether a difference is
	// data (anonymous: the heap and the runtime) or code (file-backed: the
	// binary's pages, which the kernel can drop and read again).
	per := float64(round) * (1 << 20)
	for who, m := range map[string]cluster.ProcessMemory{"operator": op, "bare": bare} {
		b.ReportMetric(m.Resident/per, who+"_rss_MiB")
		b.ReportMetric(m.Anonymous/per, who+"_rss_anon_MiB")
		b.ReportMetric(m.File/per, who+"_rss_file_MiB")
	}
	b.ReportMetric(float64(steadyCPU.Milliseconds())/steadyWall.Seconds(), "operator_steady_cpu_ms/s")
	b.ReportMetric(0, "ns/op")
}

// logHeap logs the Go heap behind the operator's RSS: what is live, where
// the next collection will start (GOGC% above the live heap), and what the
// runtime holds beside it, which is what says how much of the RSS is
// headroom.
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
	b.Logf("operator runtime: %.1f MiB of heap free but not yet returned to the OS, %.1f MiB of stacks, %.1f MiB of GC metadata",
		(gauge("go_memstats_heap_idle_bytes")-gauge("go_memstats_heap_released_bytes"))/mib, gauge("go_memstats_stack_inuse_bytes")/mib, gauge("go_memstats_gc_sys_bytes")/mib)
}

// settledRSS samples a process's memory every second for 5s and returns
// the sample with the largest RSS: what the process needs, not one GC's low
// point.
func settledRSS(b *testing.B, pid int) cluster.ProcessMemory {
	b.Helper()
	var most cluster.ProcessMemory
	for range 5 {
		time.Sleep(time.Second)
		m, err := cluster.ReadProcessMemory(pid)
		if err != nil {
			b.Fatal(err)
		}
		if m.Resident > most.Resident {
			most = m
		}
	}
	return most
}

// startBareCache builds and runs the baseline process (./barecache) and
// waits until its cache has synced.
func startBareCache(b *testing.B, w *world) *exec.Cmd {
	b.Helper()
	if w.bare == "" {
		bin, err := cluster.BuildShipped(w.dir, "barecache", "./test/bench/barecache")
		if err != nil {
			b.Fatal(err)
		}
		w.bare = bin
	}
	cmd := exec.Command(w.bare, w.cluster.Kubeconfig)
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
