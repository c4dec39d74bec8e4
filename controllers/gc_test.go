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
	instancePod := func(name, clusterID, provider, ownerName, ownerUID string) {
		t.Helper()
		labels := map[string]string{
			crawlv1alpha1.LabelClusterID:      clusterID,
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
	instancePod("orphan", testClusterID, "kind-local", "gone", "uid-gone")
	instancePod("stale-uid", testClusterID, "kind-local", "owned", "uid-of-an-earlier-proxy")
	instancePod("owned", testClusterID, "kind-local", "owned", string(owner.UID))
	instancePod("other-cluster", "other-cluster", "kind-local", "gone", "uid-gone")
	// kind-b's live pod: kind-local's sweep used to delete it ("no longer
	// uses provider kind-local") on every pass.
	instancePod("owned-by-b", testClusterID, "kind-b", "owned-by-b", string(ownerB.UID))
	// Made before instances carried their provider: no sweep can prove it
	// is its own, so none deletes it, orphan or not.
	instancePod("legacy-orphan", testClusterID, "", "gone", "uid-gone")

	mgr := newManager(t, env)
	startManager(t, mgr)
	clock := clocktesting.NewFakeClock(time.Now())
	set, err := providers.Registry{kubernetes.Type: kubernetes.New}.Build(providers.Config{Providers: []providers.InstanceConfig{
		{Name: "kind-local", Type: kubernetes.Type}, {Name: "kind-b", Type: kubernetes.Type},
	}}, providers.Dependencies{Client: mgr.GetClient()})
	require.NoError(t, err)
	gc := &OrphanCollector{
		Client: mgr.GetClient(), Providers: set, ClusterID: testClusterID,
		GracePeriod: 3 * time.Minute, Clock: clock,
	}
	all := []string{"orphan", "stale-uid", "owned", "other-cluster", "owned-by-b", "legacy-orphan"}
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

	// For real: the orphan and the earlier Proxy's instance go; the owned
	// ones of both provider instances, the other cluster's and the legacy
	// one stay, sweep after sweep.
	gc.DryRun = false
	for range 3 {
		require.NoError(t, gc.Sweep(ctx))
		assert.ElementsMatch(t, []string{"owned", "other-cluster", "owned-by-b", "legacy-orphan"}, remaining())
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
