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
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestOrphanCollector(t *testing.T) {
	env := testenv.Shared(t)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)

	owner := managedProxy(ns, "owned")
	require.NoError(t, c.Create(ctx, owner))
	instancePod := func(name, clusterID, ownerName, ownerUID string) {
		t.Helper()
		require.NoError(t, c.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
				crawlv1alpha1.LabelClusterID:      clusterID,
				crawlv1alpha1.LabelOwnerNamespace: ns,
				crawlv1alpha1.LabelOwnerName:      ownerName,
				crawlv1alpha1.LabelOwnerUID:       ownerUID,
			}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: "ubuntu/squid"}}},
		}))
	}
	instancePod("orphan", testClusterID, "gone", "uid-gone")
	instancePod("stale-uid", testClusterID, "owned", "uid-of-an-earlier-proxy")
	instancePod("owned", testClusterID, "owned", string(owner.UID))
	instancePod("other-cluster", "other-cluster", "gone", "uid-gone")

	mgr := newManager(t, env)
	startManager(t, mgr)
	clock := clocktesting.NewFakeClock(time.Now())
	gc := &OrphanCollector{
		Client: mgr.GetClient(), Providers: kubernetesProviders(t, mgr.GetClient()), ClusterID: testClusterID,
		GracePeriod: 3 * time.Minute, Clock: clock,
	}
	remaining := func() []string {
		var names []string
		for _, p := range pods(t, c, ns) {
			names = append(names, p.Name)
		}
		return names
	}
	require.Eventually(t, func() bool { return len(remaining()) == 4 }, waitFor, tick)
	found := func() float64 { return testutil.ToFloat64(orphansFound.WithLabelValues("kind-local")) }
	deleted := func() float64 { return testutil.ToFloat64(orphansDeleted.WithLabelValues("kind-local")) }
	found0, deleted0 := found(), deleted()

	// Everything is younger than the grace period: nothing is touched.
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, []string{"orphan", "stale-uid", "owned", "other-cluster"}, remaining(), "young instances are kept")
	assert.Equal(t, found0, found())

	// Past the grace period, a dry run finds both orphans and deletes nothing.
	clock.Step(3*time.Minute + time.Second)
	gc.DryRun = true
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, []string{"orphan", "stale-uid", "owned", "other-cluster"}, remaining(), "dry run deletes nothing")
	assert.Equal(t, found0+2, found())
	assert.Equal(t, deleted0, deleted())

	// For real: the orphan and the earlier Proxy's instance go; the owned one
	// and the other cluster's stay.
	gc.DryRun = false
	require.NoError(t, gc.Sweep(ctx))
	assert.ElementsMatch(t, []string{"owned", "other-cluster"}, remaining())
	assert.Equal(t, deleted0+2, deleted())

	problems, err := testutil.CollectAndLint(orphansFound)
	require.NoError(t, err)
	assert.Empty(t, problems)
	problems, err = testutil.CollectAndLint(orphansDeleted)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
