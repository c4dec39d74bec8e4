package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestOrphanCollector(t *testing.T) {
	env := testenv.Shared(t)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)

	owner := managedProxy(ns, "owned")
	require.NoError(t, c.Create(ctx, owner))
	// A live Proxy of the second kubernetes provider instance, kind-b.
	ownerB := managedProxy(ns, "owned-by-b")
	ownerB.Spec.Provider = "kind-b"
	require.NoError(t, c.Create(ctx, ownerB))
	instancePod := func(name string, owner providers.Owner, provider, ownerName, ownerUID string) {
		t.Helper()
		labels := map[string]string{
			crawlv1alpha1.LabelClusterID:      owner.ClusterID,
			crawlv1alpha1.LabelOperatorID:     owner.OperatorID,
			crawlv1alpha1.LabelOwnerNamespace: ns,
			crawlv1alpha1.LabelOwnerName:      ownerName,
			crawlv1alpha1.LabelOwnerUID:       ownerUID,
		}
		if provider != "" {
			labels[crawlv1alpha1.LabelProvider] = provider
		}
		require.NoError(t, c.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: "ubuntu/squid"}}},
		}))
	}
	instancePod("orphan", testOwner, "kind-local", "gone", "uid-gone")
	instancePod("stale-uid", testOwner, "kind-local", "owned", "uid-of-an-earlier-proxy")
	instancePod("owned", testOwner, "kind-local", "owned", string(owner.UID))
	instancePod("other-cluster", providers.Owner{ClusterID: "other-cluster", OperatorID: testOwner.OperatorID}, "kind-local", "gone", "uid-gone")
	// Another operator in this cluster, with a provider instance of the
	// same name: its instance looks orphaned from here, and is not ours.
	instancePod("other-operator", providers.Owner{ClusterID: testOwner.ClusterID, OperatorID: "tenant-b_egress-proxies-operator"}, "kind-local", "gone", "uid-gone")
	// kind-b's live pod: kind-local's sweep used to delete it ("no longer
	// uses provider kind-local") on every pass.
	instancePod("owned-by-b", testOwner, "kind-b", "owned-by-b", string(ownerB.UID))
	// Made before instances carried their provider, or their operator: no
	// sweep can prove it is its own, so none deletes it, orphan or not.
	instancePod("legacy-orphan", testOwner, "", "gone", "uid-gone")
	instancePod("legacy-operator", providers.Owner{ClusterID: testOwner.ClusterID}, "kind-local", "gone", "uid-gone")

	mgr := newManager(t, env)
	startManager(t, mgr)
	clock := clocktesting.NewFakeClock(time.Now())
	set, err := providers.Registry{kubernetes.Type: kubernetes.New}.Build(providers.Config{Providers: []providers.InstanceConfig{
		{Name: "kind-local", Type: kubernetes.Type}, {Name: "kind-b", Type: kubernetes.Type},
	}}, providers.Dependencies{Client: mgr.GetClient()})
	require.NoError(t, err)
	gc := &OrphanCollector{
		Client: mgr.GetClient(), Providers: set, Owner: testOwner,
		GracePeriod: 3 * time.Minute, Clock: clock,
	}
	all := []string{"orphan", "stale-uid", "owned", "other-cluster", "other-operator", "owned-by-b", "legacy-orphan", "legacy-operator"}
	remaining := func() []string {
		var names []string
		for _, p := range pods(t, c, ns) {
			names = append(names, p.Name)
		}
		return names
	}
	require.Eventually(t, func() bool { return len(remaining()) == len(all) }, waitFor, tick)
	found := func() float64 { return testutil.ToFloat64(orphansFound.WithLabelValues("kind-local")) }
	deleted := func() float64 { return testutil.ToFloat64(orphansDeleted.WithLabelValues("kind-local")) }
	found0, deleted0 := found(), deleted()

	// Everything is younger than the grace period: nothing is touched.
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, all, remaining(), "young instances are kept")
	assert.Equal(t, found0, found())

	// Past the grace period, a dry run finds both orphans and deletes nothing.
	clock.Step(3*time.Minute + time.Second)
	gc.DryRun = true
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, all, remaining(), "dry run deletes nothing")
	assert.Equal(t, found0+2, found())
	assert.Equal(t, deleted0, deleted())

	// An operator kept to other namespaces judges none of them, orphans
	// included: their Proxies are not its to read.
	gc.DryRun = false
	gc.Scope = operator.Scope{Namespaces: []string{"elsewhere"}}
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, all, remaining(), "out of scope: nothing deleted")
	assert.Equal(t, found0+2, found(), "out of scope: nothing found")
	gc.Scope = operator.Scope{Namespaces: []string{"elsewhere", ns}}

	// For real: the orphan and the earlier Proxy's instance go; the owned
	// ones of both provider instances, the other cluster's, the other
	// operator's and the legacy ones stay, sweep after sweep.
	for range 3 {
		require.NoError(t, gc.Sweep(ctx))
		assert.ElementsMatch(t, []string{"owned", "other-cluster", "other-operator", "owned-by-b", "legacy-orphan", "legacy-operator"}, remaining())
	}
	assert.Equal(t, deleted0+2, deleted())
	assert.Zero(t, testutil.ToFloat64(orphansDeleted.WithLabelValues("kind-b")), "kind-b deleted nothing")

	problems, err := testutil.CollectAndLint(orphansFound)
	require.NoError(t, err)
	assert.Empty(t, problems)
	problems, err = testutil.CollectAndLint(orphansDeleted)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
