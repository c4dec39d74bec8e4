package controllers

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// proxyUpdates watches one Proxy and returns, on each call, every version
// an update made of it so far.
func proxyUpdates(t *testing.T, ns, name string) func() []crawlv1alpha1.Proxy {
	t.Helper()
	env := testenv.Shared(t)
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	w, err := wc.Watch(context.Background(), &crawlv1alpha1.ProxyList{}, client.InNamespace(ns))
	require.NoError(t, err)
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	var seen []crawlv1alpha1.Proxy
	go func() {
		for e := range w.ResultChan() {
			if p, ok := e.Object.(*crawlv1alpha1.Proxy); ok && p.Name == name && e.Type == watch.Modified {
				mu.Lock()
				seen = append(seen, *p)
				mu.Unlock()
			}
		}
	}()
	return func() []crawlv1alpha1.Proxy {
		mu.Lock()
		defer mu.Unlock()
		return append([]crawlv1alpha1.Proxy(nil), seen...)
	}
}

// TestQuietStart: a new Managed proxy whose pod runs at once is written
// once, Ready with its instance and address: its creation and start are not
// recorded on the way (decision 59), and the kubernetes provider's pod,
// owned by the Proxy, needs no finalizer (decision 63). Its credentials
// record is its siblings' too (decision 60).
func TestQuietStart(t *testing.T) {
	env := testenv.Shared(t)
	startReconciler(t, env, func(c client.Client) providers.Set { return kubernetesProviders(t, c) })
	(&fakeKubelet{client: env.Client}).run(t)
	ns := env.Namespace(t)
	updates := proxyUpdates(t, ns, "quiet")
	proxy := managedProxy(ns, "quiet")
	siblings := []*crawlv1alpha1.Proxy{managedProxy(ns, "sibling-1"), managedProxy(ns, "sibling-2")}
	for _, p := range append([]*crawlv1alpha1.Proxy{proxy}, siblings...) {
		require.NoError(t, env.Client.Create(context.Background(), p))
	}
	ready := waitReady(t, env.Client, proxy)
	for _, p := range siblings {
		assert.Equal(t, ready.Status.SpecHash, waitReady(t, env.Client, p).Status.SpecHash)
	}
	time.Sleep(300 * time.Millisecond) // give a trailing write the chance to show

	// One credentials record for the three: they share a spec.
	var records corev1.SecretList
	require.NoError(t, env.Client.List(context.Background(), &records, client.InNamespace(testCredentialsNamespace),
		client.MatchingLabels{crawlv1alpha1.LabelCredentialsRole: credentials.RoleSpec, crawlv1alpha1.LabelOwnerNamespace: ns}))
	require.Len(t, records.Items, 1, "one record per spec, not per instance")
	assert.Equal(t, credentials.RecordName(ns, ready.Status.SpecHash), records.Items[0].Name)

	versions := updates()
	require.Len(t, versions, 1, "Ready, and nothing before it (the pod's owner reference stands for a finalizer): %v", phasesOf(versions))
	assert.Empty(t, versions[0].Finalizers)
	assert.Equal(t, crawlv1alpha1.PhaseReady, versions[0].Status.Phase)
	assert.Equal(t, providers.InstanceName(testOwner.ClusterID, ns, "quiet"), versions[0].Status.InstanceName, "Ready records the instance")
	assert.Equal(t, "kind-local", versions[0].Status.Provider, "and where it lives")
	assert.Equal(t, ready.Status.IP, versions[0].Status.IP)
}

func phasesOf(ps []crawlv1alpha1.Proxy) []crawlv1alpha1.ProxyPhase {
	out := make([]crawlv1alpha1.ProxyPhase, len(ps))
	for i := range ps {
		out[i] = ps[i].Status.Phase
	}
	return out
}

// TestProviderChangeDuringAQuietStart: the status records no instance while
// a new proxy's instance starts, so when spec.provider changes then, the
// reconciler finds that instance by its owner in the old provider and
// deletes it before creating the new one: never two instances for one
// Proxy, none leaked. And a start slower than QuietStart is recorded as
// Provisioning.
func TestProviderChangeDuringAQuietStart(t *testing.T) {
	env := testenv.Shared(t)
	// VMs never finish provisioning within the test, and no kubelet runs
	// the pods.
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{Provisioning: time.Hour, Stopping: 100 * time.Millisecond})
	t.Cleanup(fake.Close)
	startReconciler(t, env, func(c client.Client) providers.Set {
		set := kubernetesProviders(t, c)
		maps.Copy(set, gcpProviders(t, fake))
		return set
	})
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)
	proxy, slow := managedProxy(ns, "moves"), gcpManagedProxy(ns, "slow")
	require.NoError(t, c.Create(ctx, proxy))
	require.NoError(t, c.Create(ctx, slow))
	require.Eventually(t, func() bool { return len(pods(t, c, ns)) == 1 }, waitFor, tick, "the pod is created")
	var p crawlv1alpha1.Proxy
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(proxy), &p))
	require.Empty(t, p.Status.InstanceName, "a quiet start: nothing recorded yet")

	p.Spec.Provider = "gcp-eu"
	p.Spec.Placement = &crawlv1alpha1.Placement{Zone: "europe-west1-b", MachineType: "e2-small"}
	require.NoError(t, c.Update(ctx, &p))
	require.Eventually(t, func() bool { return len(pods(t, c, ns)) == 0 && len(vmsOf(fake, proxy)) == 1 }, waitFor, tick,
		"the pod in kind-local is deleted and a VM created in gcp-eu: %d pods, %d VMs", len(pods(t, c, ns)), len(vmsOf(fake, proxy)))
	moved := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Provider == "gcp-eu" })
	assert.Equal(t, vmsOf(fake, proxy)[0].GetName(), moved.Status.InstanceName)

	// The VM created beside it, still provisioning after QuietStart, is
	// recorded as Provisioning, with the instance and where it lives.
	provisioning := waitFor2(t, c, slow, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseProvisioning })
	assert.Equal(t, "gcp-eu", provisioning.Status.Provider)
	assert.Equal(t, vmsOf(fake, slow)[0].GetName(), provisioning.Status.InstanceName)
	assert.Equal(t, ReasonProvisioning, meta.FindStatusCondition(provisioning.Status.Conditions, crawlv1alpha1.ConditionProvisioned).Reason)
}
