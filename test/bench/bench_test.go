// Package bench measures the operator binary end to end on the local
// control plane: how long a thousand proxies take to become Ready, how many
// API writes each costs, and how much memory ten thousand take. Every
// figure is reported beside the limit it runs up against, measured in the
// same run on the same API server: a bare client doing only the writes a
// proxy needs, a bare process holding only the cache. `make bench` runs it
// with the other packages' benchmarks and prints the table.
package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// clientWorkers is how many goroutines create objects, in the operator's
// runs and the bare ones alike.
const clientWorkers = 16

// world is a local cluster with the operator binary built, for one
// benchmark.
type world struct {
	cluster *cluster.Cluster
	bin     string
	dir     string
	// bare is the memory benchmark's baseline binary, once built.
	bare string
	// pprof is the last started operator's /debug/pprof address, when
	// $BENCH_PROFILE asks for profiles.
	pprof string
}

func newWorld(b *testing.B, opts cluster.Options) *world {
	b.Helper()
	dir := b.TempDir()
	c, err := cluster.Start(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Stop)
	bin, err := cluster.BuildOperator(dir)
	if err != nil {
		b.Fatal(err)
	}
	return &world{cluster: c, bin: bin, dir: dir}
}

// startOperator runs the operator with plain-HTTP metrics on a free
// loopback port (to read its request counters), the default probe interval
// (the harness's 1s would make probing, not reconciling, the work) and the
// bare client's own client-side limits (envtest's 1000/s, burst 2000), so
// the two are compared on the same terms. At the shipped --kube-api-qps of
// 50, writes per proxy ÷ 50 bounds the rate instead (docs/performance.md).
func (w *world) startOperator(b *testing.B, env ...string) (*cluster.Operator, string) {
	b.Helper()
	metrics := cluster.FreeAddr()
	args := []string{"--metrics-bind-address=" + metrics, "--metrics-secure=false", "--health-interval=30s", "--health-timeout=10s",
		"--kube-api-qps=1000", "--kube-api-burst=2000"}
	if os.Getenv(profileEnv) != "" {
		w.pprof = cluster.FreeAddr()
		args = append(args, "--pprof-bind-address="+w.pprof)
	}
	op, err := w.cluster.StartOperator(w.bin, cluster.OperatorOptions{
		Env:           env,
		DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
		ExtraArgs: args,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(op.Stop)
	return op, "http://" + metrics + "/metrics"
}

// startExternals starts the in-process CONNECT proxies that External
// Proxies point at, several Proxies to each, and returns their addresses.
func startExternals(b *testing.B) []string {
	b.Helper()
	var addrs []string
	for range externalListeners {
		p, err := cluster.StartConnectProxy("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		addrs = append(addrs, p.Addr)
	}
	return addrs
}

// externalEndpoint points an External Proxy at addr.
func externalEndpoint(addr string) *crawlv1alpha1.ExternalEndpoint {
	host, port, _ := net.SplitHostPort(addr) // one of startExternals' own
	n, _ := strconv.Atoi(port)
	return &crawlv1alpha1.ExternalEndpoint{Address: host, Port: int32(n)}
}

// forEach runs do(i) for i in [0, n) on clientWorkers goroutines and returns
// the first error.
func forEach(n int, do func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range clientWorkers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := do(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// readyWatch counts, from an informer of its own, the Proxies of a
// namespace whose Ready condition is True, and says when n are. It keeps a
// running count: a recount on each of tens of thousands of events would be
// load on the machine the operator is measured on.
type readyWatch struct {
	mu    sync.Mutex
	ready map[string]bool
	// phases are the Proxies' phases, for the progress log.
	phases map[string]crawlv1alpha1.ProxyPhase
	count  int
	n      int
	done   chan struct{}
	once   sync.Once
}

// watchReady starts the watch for n Ready Proxies; its informer ends with
// the benchmark.
func watchReady(b *testing.B, c *cluster.Cluster, namespace string, n int) *readyWatch {
	b.Helper()
	return watchProxies(b, c, namespace, n, func(p *crawlv1alpha1.Proxy) bool {
		return meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady)
	})
}

// watchProxies starts a watch for n Proxies that are done by the measure
// of done; its informer ends with the benchmark.
func watchProxies(b *testing.B, c *cluster.Cluster, namespace string, n int, done func(*crawlv1alpha1.Proxy) bool) *readyWatch {
	b.Helper()
	ctx := b.Context()
	informers, err := cache.New(c.Env.Config, cache.Options{Scheme: c.Env.Scheme, DefaultNamespaces: map[string]cache.Config{namespace: {}}})
	if err != nil {
		b.Fatal(err)
	}
	inf, err := informers.GetInformer(ctx, &crawlv1alpha1.Proxy{})
	if err != nil {
		b.Fatal(err)
	}
	w := &readyWatch{ready: map[string]bool{}, phases: map[string]crawlv1alpha1.ProxyPhase{}, n: n, done: make(chan struct{})}
	see := func(obj any) {
		p, ok := obj.(*crawlv1alpha1.Proxy)
		if !ok {
			return
		}
		ready := done(p)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.phases[p.Name] = p.Status.Phase
		switch was := w.ready[p.Name]; {
		case ready && !was:
			w.count++
		case !ready && was:
			w.count--
		}
		w.ready[p.Name] = ready
		if w.count >= w.n {
			w.once.Do(func() { close(w.done) })
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }}); err != nil {
		b.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		b.Fatal("the ready watch's cache did not sync")
	}
	return w
}

// wait blocks until n Proxies are Ready, logging every 5s how many are
// (and their phases, which show where bring-up spends its time), and fails
// after readyTimeout with how many were and the end of the operator's log (op
// is nil for a bare run).
func (w *readyWatch) wait(b *testing.B, op *cluster.Operator) {
	b.Helper()
	start := time.Now()
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
	deadline := time.After(readyTimeout)
	for {
		select {
		case <-w.done:
			return
		case <-progress.C:
			w.mu.Lock()
			byPhase := map[crawlv1alpha1.ProxyPhase]int{}
			for _, ph := range w.phases {
				byPhase[ph]++
			}
			b.Logf("after %s: %d of %d done; by phase %v", time.Since(start).Round(time.Second), w.count, w.n, byPhase)
			w.mu.Unlock()
		case <-deadline:
			logTail(b, op)
			w.mu.Lock()
			defer w.mu.Unlock()
			b.Fatalf("only %d of %d Proxies Ready after %s", w.count, w.n, readyTimeout)
		}
	}
}

// logTail logs the end of the operator's log, for a benchmark that failed.
func logTail(b *testing.B, op *cluster.Operator) {
	if op == nil {
		return
	}
	if log, err := os.ReadFile(op.Log); err == nil {
		b.Logf("the operator's log ends:\n%s", log[max(0, len(log)-8000):])
	}
}

// apiWrites is the operator's count of mutating requests to the API
// server so far (client-go's rest_client_requests_total, which
// controller-runtime exports), by method.
func apiWrites(b *testing.B, metricsURL string) map[string]float64 {
	b.Helper()
	families, err := cluster.ScrapeMetrics(metricsURL)
	if err != nil {
		b.Fatal(err)
	}
	family, ok := families["rest_client_requests_total"]
	if !ok {
		b.Fatal("the operator exports no rest_client_requests_total")
	}
	// By method and answer ("PUT 409"), so that a write bound to conflict
	// shows in the log for what it is.
	writes := map[string]float64{}
	for _, m := range family.GetMetric() {
		var method, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "method":
				method = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		if method != "" && method != http.MethodGet {
			writes[method+" "+code] += m.GetCounter().GetValue()
		}
	}
	return writes
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

func readyCondition() metav1.Condition {
	return metav1.Condition{Type: crawlv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Bare", Message: "written by the bare baseline"}
}

// mustNamespace creates a namespace.
func mustNamespace(b *testing.B, c client.Client, name string) {
	b.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		b.Fatal(err)
	}
}

// profileEnv names a file prefix: when set, a bring-up benchmark saves the
// operator's CPU profile of its first seconds, and a memory benchmark its
// heap once the fleet is Ready, as <prefix>-<name>.pprof, for
// `go tool pprof`.
const profileEnv = "BENCH_PROFILE"

// profileOperator starts recording the running operator's CPU profile for
// d, when $BENCH_PROFILE asks for it; wait for the returned function before
// stopping the operator.
func (w *world) profileOperator(b *testing.B, name string, d time.Duration) func() {
	b.Helper()
	return w.saveProfile(b, name, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())))
}

// heapProfile saves the running operator's heap profile (after a GC, so it
// shows what is live), when $BENCH_PROFILE asks for it.
func (w *world) heapProfile(b *testing.B, name string) {
	b.Helper()
	w.saveProfile(b, name, "heap?gc=1")()
}

// profileAPIServer saves the API server's CPU profile of the next d into
// <prefix>-apiserver-<name>.pprof, when $BENCH_PROFILE asks for it: the
// bring-up's time follows the API server's CPU, and comparing a bare run's
// profile with the operator's shows what the operator's writes cost it.
func (w *world) profileAPIServer(b *testing.B, name string, d time.Duration) func() {
	b.Helper()
	if os.Getenv(profileEnv) == "" {
		return func() {}
	}
	httpClient, url, err := w.cluster.APIServerClient(fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())))
	if err != nil {
		b.Fatal(err)
	}
	return fetchProfile(b, httpClient, url, "apiserver-"+name)
}

// saveProfile fetches /debug/pprof/<what> from the running operator into
// <prefix>-<name>.pprof in the background; the returned function waits.
func (w *world) saveProfile(b *testing.B, name, what string) func() {
	b.Helper()
	if os.Getenv(profileEnv) == "" || w.pprof == "" {
		return func() {}
	}
	return fetchProfile(b, http.DefaultClient, fmt.Sprintf("http://%s/debug/pprof/%s", w.pprof, what), name)
}

// fetchProfile GETs a profile from url into <prefix>-<name>.pprof in the
// background; the returned function waits for it.
func fetchProfile(b *testing.B, httpClient *http.Client, url, name string) func() {
	b.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := httpClient.Get(url) //nolint:noctx // bounded by the profile's own duration
		if err != nil {
			b.Logf("profiling: %v", err)
			return
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Logf("profiling: %s answered %s", url, res.Status)
			return
		}
		path := fmt.Sprintf("%s-%s.pprof", os.Getenv(profileEnv), name)
		f, err := os.Create(path)
		if err != nil {
			b.Logf("profiling: %v", err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, res.Body); err != nil {
			b.Logf("profiling: %v", err)
			return
		}
		b.Logf("profile saved: %s", path)
	}()
	return func() { <-done }
}

// apiServerRequests is what the API server has done so far, from its own
// metrics: requests answered by verb and resource ("PUT proxies/status"),
// and watch events sent and their bytes by resource ("watch-events pods").
// The difference over a bring-up shows every request each side made, reads
// included, and what its writes fanned out to, not only the operator's
// writes.
func apiServerRequests(b *testing.B, c *cluster.Cluster) map[string]float64 {
	b.Helper()
	families, err := c.ScrapeAPIServer()
	if err != nil {
		b.Fatal(err)
	}
	requests := map[string]float64{}
	// Watch events sent, and their bytes, by kind: what each write fans
	// out to the watchers of its kind.
	for _, family := range []string{"apiserver_watch_events_total", "apiserver_watch_events_sizes"} {
		for _, m := range families[family].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "resource" && l.GetName() != "kind" {
					continue
				}
				if h := m.GetHistogram(); h != nil {
					requests["watch-bytes "+l.GetValue()] += h.GetSampleSum()
				} else {
					requests["watch-events "+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		resource := labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			resource += "/" + sub
		}
		requests[labels["verb"]+" "+resource] += m.GetCounter().GetValue()
	}
	return requests
}

// statusConflicts is cluster.StatusConflicts, failing b on an error.
func statusConflicts(b *testing.B, c *cluster.Cluster) float64 {
	b.Helper()
	n, err := c.StatusConflicts()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// requestsSince is what was answered between two apiServerRequests.
func requestsSince(before, after map[string]float64) map[string]float64 {
	delta := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			delta[k] = d
		}
	}
	return delta
}
