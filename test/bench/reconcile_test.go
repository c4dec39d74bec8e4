package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

const (
	readyTimeout = 10 * time.Minute
	// externalListeners are the in-process CONNECT proxies External
	// Proxies point at (several Proxies share one, as in the health bench).
	externalListeners = 8
	// apiServerProfile is how long the API server is profiled from the
	// start of each side's bring-up (with $BENCH_PROFILE): about the bare
	// External 1,000's whole run, so the two profiles cover the same span.
	apiServerProfile = 2 * time.Second
)

// BenchmarkReconcileExternal1000 brings 1,000 External Proxies to Ready
// (provisioned, then probed Healthy) and compares the time with a bare
// client's 1,000 creates plus status writes on the same API server.
func BenchmarkReconcileExternal1000(b *testing.B) {
	benchReconcile(b, crawlv1alpha1.ModeExternal, 1000)
}

// BenchmarkReconcileExternal4000 is the same at four times the fleet: with
// the 1,000 figure, the table shows how the cost grows.
func BenchmarkReconcileExternal4000(b *testing.B) {
	benchReconcile(b, crawlv1alpha1.ModeExternal, 4000)
}

// BenchmarkReconcileManaged1000 does the same for 1,000 Managed Proxies on
// the kubernetes provider, the pods marked running by the harness; the bare
// client does what bringing one up takes: the Proxy, an object of its
// configuration and its pod, the pod's status (the kubelet's write) and the
// Proxy's status.
func BenchmarkReconcileManaged1000(b *testing.B) { benchReconcile(b, crawlv1alpha1.ModeManaged, 1000) }

// BenchmarkReconcileManaged4000 is the Managed bring-up at 4,000.
func BenchmarkReconcileManaged4000(b *testing.B) { benchReconcile(b, crawlv1alpha1.ModeManaged, 4000) }

func benchReconcile(b *testing.B, mode crawlv1alpha1.ProxyMode, reconcileProxies int) {
	w := newWorld(b, cluster.Options{MarkPods: true})
	c := w.cluster.Env.Client
	ctx := context.Background()
	externals := startExternals(b)
	newProxy := func(ns string, i int) *crawlv1alpha1.Proxy {
		p := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("px-%04d", i)},
			Spec: crawlv1alpha1.ProxySpec{Mode: mode, Attributes: map[string]string{"bench": "reconcile"}}}
		if mode == crawlv1alpha1.ModeManaged {
			p.Spec.Provider = cluster.ProviderName
			return p
		}
		p.Spec.External = externalEndpoint(externals[i%len(externals)])
		return p
	}

	controlPlane, err := cluster.ControlPlanePIDs()
	if err != nil {
		b.Fatal(err)
	}
	var bareTime, opTime time.Duration
	// Writes: the bare client's whole sequence, against the creates the
	// harness makes, the pod marker's status writes (the kubelet's) and the
	// operator's own (the target is on the latter), so the pair
	// counts what the API server takes.
	var bareWrites, opWrites, opOwnWrites float64
	// The API server's and etcd's CPU time while each side brings the fleet
	// up: on a shared API server, what the operator costs everyone else.
	var bareControlPlaneCPU, opControlPlaneCPU, opSelfCPU time.Duration
	// The API server's 409s to the operator's status writes: two writers
	// of one status (the reconciler's and the health engine's) each apply
	// only their own fields, so there must be none.
	var opConflicts float64
	round := 0
	for b.Loop() {
		round++
		// The limit: only the writes bringing a proxy up needs, from a
		// bare client, before the operator runs; the same watch as the
		// operator's run sees them Ready, so the harness's own load on the
		// API server is on both sides.
		bareNS := fmt.Sprintf("bare-%d", round)
		mustNamespace(b, c, bareNS)
		bareReady := watchReady(b, w.cluster, bareNS, reconcileProxies)
		cpu0, requests0 := cpuTime(b, controlPlane), apiServerRequests(b, w.cluster)
		t0 := time.Now()
		profiledBare := w.profileAPIServer(b, fmt.Sprintf("bare-%s%d-round%d", mode, reconcileProxies, round), apiServerProfile)
		writes, err := bareBringUp(ctx, c, bareNS, mode, reconcileProxies, newProxy)
		if err != nil {
			b.Fatal(err)
		}
		bareReady.wait(b, nil)
		bareTime += time.Since(t0)
		profiledBare()
		bareControlPlaneCPU += cpuTime(b, controlPlane) - cpu0
		bareWrites += float64(writes)
		b.Logf("the API server answered, bare: %v", requestsSince(requests0, apiServerRequests(b, w.cluster)))
		for _, obj := range []client.Object{&crawlv1alpha1.Proxy{}, &corev1.Pod{}, &corev1.ConfigMap{}} {
			if err := c.DeleteAllOf(ctx, obj, client.InNamespace(bareNS)); err != nil {
				b.Fatal(err)
			}
		}

		// The operator: create the Proxies, wait until all are Ready.
		op, metrics := w.startOperator(b)
		ns := fmt.Sprintf("operator-%d", round)
		mustNamespace(b, c, ns)
		ready := watchReady(b, w.cluster, ns, reconcileProxies)
		before, markerBefore := sum(apiWrites(b, metrics)), w.cluster.Marker.Writes()
		self := map[string]int{"operator": op.PID()}
		cpu0, self0, requests0 := cpuTime(b, controlPlane), cpuTime(b, self), apiServerRequests(b, w.cluster)
		conflicts0 := statusConflicts(b, w.cluster)
		t0 = time.Now()
		profiled := w.profileOperator(b, fmt.Sprintf("%s%d-round%d", mode, reconcileProxies, round), 10*time.Second)
		profiledAPIServer := w.profileAPIServer(b, fmt.Sprintf("operator-%s%d-round%d", mode, reconcileProxies, round), apiServerProfile)
		if err := forEach(reconcileProxies, func(i int) error { return c.Create(ctx, newProxy(ns, i)) }); err != nil {
			b.Fatal(err)
		}
		ready.wait(b, op)
		profiled()
		profiledAPIServer()
		opTime += time.Since(t0)
		opControlPlaneCPU += cpuTime(b, controlPlane) - cpu0
		opSelfCPU += cpuTime(b, self) - self0
		b.Logf("the API server answered, operator: %v", requestsSince(requests0, apiServerRequests(b, w.cluster)))
		after := settledWrites(b, metrics)
		opConflicts += statusConflicts(b, w.cluster) - conflicts0
		own := sum(after) - before
		opOwnWrites += own
		opWrites += own + float64(reconcileProxies) + float64(w.cluster.Marker.Writes()-markerBefore)
		b.Logf("operator writes by method: %v (before the run: %.0f)", after, before)
		op.Stop()
	}
	n := float64(round * reconcileProxies)
	b.ReportMetric(opTime.Seconds()/float64(round), "operator_s")
	b.ReportMetric(bareTime.Seconds()/float64(round), "bare_s")
	b.ReportMetric(opWrites/n, "operator_writes/proxy")
	b.ReportMetric(bareWrites/n, "bare_writes/proxy")
	b.ReportMetric(opOwnWrites/n, "operator_own_writes/proxy")
	b.ReportMetric(msPer(opControlPlaneCPU, n), "operator_controlplane_cpu_ms/proxy")
	b.ReportMetric(msPer(bareControlPlaneCPU, n), "bare_controlplane_cpu_ms/proxy")
	b.ReportMetric(msPer(opSelfCPU, n), "operator_process_cpu_ms/proxy")
	b.ReportMetric(opConflicts/float64(round), "operator_status_conflicts")
	b.ReportMetric(0, "ns/op")
}

// cpuTime is the CPU time the processes have used so far, together.
func cpuTime(b *testing.B, pids map[string]int) time.Duration {
	b.Helper()
	var total time.Duration
	for _, pid := range pids {
		t, err := cluster.CPUTime(pid)
		if err != nil {
			b.Fatal(err)
		}
		total += t
	}
	return total
}

// msPer is d in milliseconds per one of n.
func msPer(d time.Duration, n float64) float64 {
	return float64(d.Milliseconds()) / n
}

// settledWrites waits until the operator's write counter stops moving (the
// Events and status writes that trail the last Ready) and returns it.
func settledWrites(b *testing.B, metrics string) map[string]float64 {
	b.Helper()
	last := apiWrites(b, metrics)
	for range 30 {
		time.Sleep(time.Second)
		now := apiWrites(b, metrics)
		if sum(now) == sum(last) {
			return now
		}
		last = now
	}
	b.Fatal("the operator kept writing 30s after every Proxy was Ready")
	return nil
}

// bareBringUp does, for each proxy, only the writes that bringing it up
// takes, and returns how many it made.
func bareBringUp(ctx context.Context, c client.Client, ns string, mode crawlv1alpha1.ProxyMode, n int, newProxy func(string, int) *crawlv1alpha1.Proxy) (int, error) {
	var writes atomic.Int64
	counted := func(err error) error {
		if err == nil {
			writes.Add(1)
		}
		return err
	}
	err := forEach(n, func(i int) error {
		p := newProxy(ns, i)
		if err := counted(c.Create(ctx, p)); err != nil {
			return err
		}
		ip := "127.0.0.1"
		if mode == crawlv1alpha1.ModeManaged {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name},
				Data: map[string]string{"squid.conf": strings.Repeat("# a squid.conf of a realistic size\n", 40)}}
			if err := counted(c.Create(ctx, cm)); err != nil {
				return err
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: "ubuntu/squid",
					Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: crawlv1alpha1.DefaultPort}}}}}}
			if err := counted(c.Create(ctx, pod)); err != nil {
				return err
			}
			ip = cluster.LoopbackIP(4, i)
			pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			if err := counted(c.Status().Update(ctx, pod)); err != nil {
				return err
			}
		}
		p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: crawlv1alpha1.DefaultPort}
		meta.SetStatusCondition(&p.Status.Conditions, readyCondition())
		return counted(c.Status().Update(ctx, p))
	})
	return int(writes.Load()), err
}
