package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// TestScopedOperators runs two operator processes on one API server, as two
// releases of one cluster would: each scoped to its own namespace, both with
// a provider instance called gcp-eu in the same Compute project, and both
// with orphan GC sweeping every second. Each Proxy goes Ready under its own
// operator and stays so; neither GC deletes the other's VMs or firewall
// rule; a Proxy outside both scopes is touched by neither.
func TestScopedOperators(t *testing.T) {
	dir := t.TempDir()
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{Provisioning: 500 * time.Millisecond, Staging: 500 * time.Millisecond, Stopping: time.Second})
	t.Cleanup(fake.Close)
	c, err := cluster.Start(dir, cluster.Options{ExtraProviders: cluster.GCPProvider("gcp-eu", "crawl-shared", "europe-west1-b", fake.URL)})
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	vms := cluster.NewVMRunner(fake)
	go vms.Run(t.Context())
	t.Cleanup(vms.CloseAll)

	ctx := context.Background()
	cl := c.Env.Client
	type tenant struct{ name, home, watched string }
	tenants := []tenant{{"tenant-a", "tenant-a-system", "crawl-a"}, {"tenant-b", "tenant-b-system", "crawl-b"}}
	for _, ns := range []string{"tenant-a-system", "tenant-b-system", "crawl-a", "crawl-b", "crawl-other"} {
		require.NoError(t, cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	for _, tn := range tenants {
		// Each release as its chart runs it: its namespace and name in the
		// environment (the operator id and credentials namespace follow),
		// its scope from OLM's variable.
		op, err := c.StartOperator(world.bin, cluster.OperatorOptions{
			DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
			ExtraArgs: []string{"--gc-interval=1s", "--gc-grace-period=1s", "--instance-resync-interval=1s"},
			Env:       []string{"POD_NAMESPACE=" + tn.home, "OPERATOR_NAME=" + tn.name, "WATCH_NAMESPACE=" + tn.watched},
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			op.Stop()
			if t.Failed() {
				out, _ := readTail(op.Log, 6000)
				t.Logf("--- %s's operator log (tail) ---\n%s", tn.name, out)
			}
		})
	}

	// The same name in every namespace: their instances must still differ.
	proxy := func(ns string) *crawlv1alpha1.Proxy {
		return &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edge"}, Spec: crawlv1alpha1.ProxySpec{
			Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: crawlv1alpha1.DefaultPort,
			Placement: &crawlv1alpha1.Placement{Zone: "europe-west1-b", MachineType: "e2-small"},
		}}
	}
	for _, ns := range []string{"crawl-a", "crawl-b", "crawl-other"} {
		require.NoError(t, cl.Create(ctx, proxy(ns)))
	}
	ready := map[string]*crawlv1alpha1.Proxy{}
	for _, tn := range tenants {
		ready[tn.watched] = waitProxyIn(t, c, client.ObjectKey{Namespace: tn.watched, Name: "edge"}, "Ready and Healthy", readyAndHealthy)
	}
	require.NotEqual(t, ready["crawl-a"].Status.InstanceName, ready["crawl-b"].Status.InstanceName)
	require.Len(t, fake.Instances(), 2, "one VM per scoped Proxy, none for the Proxy outside both scopes")
	require.Len(t, fake.Firewalls("crawl-shared"), 2, "a firewall rule per operator for its own gcp-eu")

	// Several sweeps of both GCs, watched every 200ms: nothing flaps,
	// nothing is deleted.
	sweeps := fake.Requests("firewalls.list")
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		for ns, want := range ready {
			var p crawlv1alpha1.Proxy
			require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "edge"}, &p))
			require.True(t, readyAndHealthy(&p), "%s/edge left Ready: %+v", ns, p.Status)
			require.Equal(t, want.Status.InstanceName, p.Status.InstanceName, "%s/edge's instance changed", ns)
			require.Equal(t, want.Status.IP, p.Status.IP, "%s/edge was replaced", ns)
			cond := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionReady)
			require.Equal(t, meta.FindStatusCondition(want.Status.Conditions, crawlv1alpha1.ConditionReady).LastTransitionTime, cond.LastTransitionTime,
				"%s/edge's Ready condition flapped", ns)
		}
		require.Len(t, fake.Instances(), 2, "a VM was deleted")
		time.Sleep(200 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, fake.Requests("firewalls.list")-sweeps, 2*4, "both GCs swept several times")
	assert.Zero(t, fake.Requests("delete"), "no VM deleted by either GC")
	assert.Zero(t, fake.Requests("firewalls.delete"), "no firewall rule deleted by either GC")
	var names []string
	for _, vm := range fake.Instances() {
		names = append(names, vm.GetName())
		assert.Contains(t, []string{"tenant-a-system_tenant-a", "tenant-b-system_tenant-b"}, vm.GetLabels()["crawl-operator-id"],
			"every VM names its operator: <namespace>_<name> of its release")
	}
	assert.ElementsMatch(t, []string{ready["crawl-a"].Status.InstanceName, ready["crawl-b"].Status.InstanceName}, names)

	for _, ns := range []string{"crawl-a", "crawl-b"} {
		var events eventsv1.EventList
		require.NoError(t, cl.List(ctx, &events, client.InNamespace(ns)))
		for _, e := range events.Items {
			assert.NotEqual(t, corev1.EventTypeWarning, e.Type, "%s: %s %s", ns, e.Reason, e.Note)
		}
	}

	// Outside both scopes: no finalizer, no status, no Event.
	var outside crawlv1alpha1.Proxy
	require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: "crawl-other", Name: "edge"}, &outside))
	assert.Empty(t, outside.Finalizers, "no operator took the Proxy outside its scope")
	assert.Equal(t, crawlv1alpha1.ProxyStatus{}, outside.Status, "no operator wrote its status")
	var events eventsv1.EventList
	require.NoError(t, cl.List(ctx, &events, client.InNamespace("crawl-other")))
	assert.Empty(t, events.Items, "no operator recorded an Event for it")

	// Each operator deletes its own Proxy's VM, and only that.
	require.NoError(t, cl.Delete(ctx, ready["crawl-a"]))
	require.Eventually(t, func() bool {
		vms := fake.Instances()
		return len(vms) == 1 && vms[0].GetName() == ready["crawl-b"].Status.InstanceName
	}, waitFor, poll, "tenant-a's VM is deleted with its Proxy, tenant-b's stays")
}

// readTail is the last n bytes of a file.
func readTail(path string, n int) (string, error) {
	out, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out[max(0, len(out)-n):])), nil
}
