package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// poolMembers is the size of the pool the bring-up benchmark starts.
const poolMembers = 500

// BenchmarkPoolBringUp500 measures how long a ProxyPool of 500 takes from
// its create to every member available (Ready and Healthy), beside its
// baseline: 500 single Managed Proxies that a client creates (16 workers)
// and the same operator brings to Ready and Healthy. The baseline is what a
// user scripting a fleet gets today; the pool must not cost much more for
// doing the creates itself. Both run on the kubernetes provider with the
// harness's pods, one after the other on one operator.
func BenchmarkPoolBringUp500(b *testing.B) {
	w := newWorld(b, cluster.Options{MarkPods: true})
	c := w.cluster.Env.Client
	ctx := context.Background()
	op, _ := w.startOperator(b)
	spec := crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: cluster.ProviderName, Port: crawlv1alpha1.DefaultPort,
		Attributes: map[string]string{"bench": "pool"}}

	var singlesTime, poolTime time.Duration
	conflicts0 := statusConflicts(b, w.cluster)
	round := 0
	for b.Loop() {
		round++
		singlesNS := fmt.Sprintf("singles-%d", round)
		mustNamespace(b, c, singlesNS)
		serving := watchProxies(b, w.cluster, singlesNS, poolMembers, readyAndHealthy)
		t0 := time.Now()
		if err := forEach(poolMembers, func(i int) error {
			return c.Create(ctx, &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: singlesNS, Name: fmt.Sprintf("px-%04d", i)}, Spec: spec})
		}); err != nil {
			b.Fatal(err)
		}
		serving.wait(b, op)
		singlesTime += time.Since(t0)

		poolNS := fmt.Sprintf("pool-%d", round)
		mustNamespace(b, c, poolNS)
		replicas := int32(poolMembers)
		pool := &crawlv1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "fleet"},
			Spec: crawlv1alpha1.ProxyPoolSpec{Replicas: &replicas, Zones: []string{"zone-a", "zone-b", "zone-c"},
				Template: crawlv1alpha1.ProxyTemplate{Spec: spec}}}
		t0 = time.Now()
		if err := c.Create(ctx, pool); err != nil {
			b.Fatal(err)
		}
		waitPoolAvailable(b, c, pool, readyTimeout, op)
		poolTime += time.Since(t0)
		b.Logf("round %d: 500 single Proxies serving in %s, a pool of 500 available in %s", round,
			(singlesTime / time.Duration(round)).Round(time.Millisecond), (poolTime / time.Duration(round)).Round(time.Millisecond))
	}
	b.ReportMetric(poolTime.Seconds()/float64(round), "pool_s")
	b.ReportMetric(singlesTime.Seconds()/float64(round), "bare_s")
	b.ReportMetric((statusConflicts(b, w.cluster)-conflicts0)/float64(round), "operator_status_conflicts")
	b.ReportMetric(0, "ns/op")
}

// readyAndHealthy is what a member must be to count as available.
func readyAndHealthy(p *crawlv1alpha1.Proxy) bool {
	return meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady) &&
		meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionHealthy)
}

// waitPoolAvailable polls the pool's status (five reads a second, no load
// to speak of) until every member is available, failing after timeout.
func waitPoolAvailable(b *testing.B, c client.Client, pool *crawlv1alpha1.ProxyPool, timeout time.Duration, op *cluster.Operator) {
	b.Helper()
	start := time.Now()
	deadline, nextLog := start.Add(timeout), start.Add(5*time.Second)
	var got crawlv1alpha1.ProxyPool
	for time.Now().Before(deadline) {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(pool), &got); err != nil {
			b.Fatal(err)
		}
		if got.Status.ObservedGeneration == got.Generation && got.Status.AvailableReplicas == *pool.Spec.Replicas {
			return
		}
		if time.Now().After(nextLog) {
			var members crawlv1alpha1.ProxyList
			if err := c.List(context.Background(), &members, client.InNamespace(pool.Namespace)); err != nil {
				b.Fatal(err)
			}
			serving, byPhase := 0, map[crawlv1alpha1.ProxyPhase]int{}
			for i := range members.Items {
				if readyAndHealthy(&members.Items[i]) {
					serving++
				}
				byPhase[members.Items[i].Status.Phase]++
			}
			b.Logf("after %s: the pool says %d of %d available; %d members by phase %v, %d of them Ready and Healthy",
				time.Since(start).Round(time.Second), got.Status.AvailableReplicas, *pool.Spec.Replicas, len(members.Items), byPhase, serving)
			nextLog = nextLog.Add(5 * time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
	logTail(b, op)
	b.Fatalf("ProxyPool %s/%s: %d of %d members available after %s", pool.Namespace, pool.Name, got.Status.AvailableReplicas, *pool.Spec.Replicas, timeout)
}
