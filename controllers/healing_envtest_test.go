package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// fakeHealth is the health engine's in-memory view, as a test sets it for
// a proxy at its current address. Like the engine, it knows nothing of a
// proxy at any other address: a replacement starts unprobed.
type fakeHealth struct {
	reader client.Reader
	mu     sync.Mutex
	health map[types.NamespacedName]addressedHealth
}

type addressedHealth struct {
	ip string
	h  ProxyHealth
}

func (f *fakeHealth) Health(key types.NamespacedName) (ProxyHealth, bool) {
	f.mu.Lock()
	h, ok := f.health[key]
	f.mu.Unlock()
	var p crawlv1alpha1.Proxy
	if !ok || f.reader.Get(context.Background(), key, &p) != nil || !p.Serving() || p.Status.IP != h.ip {
		return ProxyHealth{}, false
	}
	return h.h, true
}

func (f *fakeHealth) set(p *crawlv1alpha1.Proxy, h ProxyHealth) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.health == nil {
		f.health = map[types.NamespacedName]addressedHealth{}
	}
	f.health[client.ObjectKeyFromObject(p)] = addressedHealth{ip: p.Status.IP, h: h}
}

// healingOperator is a reconciler with the instance watcher, a fake health
// view and a trigger channel, as main wires them.
type healingOperator struct {
	health   *fakeHealth
	triggers chan event.GenericEvent
}

func startHealingOperator(t *testing.T, env *testenv.Env, set func(client.Client) providers.Set, policy ReplacementPolicy, bound int) *healingOperator {
	t.Helper()
	mgr := newManager(t, env)
	op := &healingOperator{health: &fakeHealth{reader: mgr.GetClient()}, triggers: make(chan event.GenericEvent, 64)}
	provs := set(mgr.GetClient())
	require.NoError(t, (&ProxyReconciler{
		Client: mgr.GetClient(), Providers: provs, Owner: testOwner,
		Recorder: mgr.GetEventRecorder("egress-proxies-operator"), PollInterval: 100 * time.Millisecond,
		Health: op.health, Replacement: policy, MaxReplacementsInFlight: bound, Triggers: op.triggers,
		CredentialsCache: credentialsCache(t, mgr), CredentialsNamespace: testCredentialsNamespace,
	}).SetupWithManager(mgr))
	require.NoError(t, mgr.Add(&InstanceWatcher{
		Client: mgr.GetClient(), Providers: provs, Owner: testOwner,
		Interval: 200 * time.Millisecond, Triggers: op.triggers,
	}))
	startManager(t, mgr)
	return op
}

// trigger tells the reconciler of a verdict change, as the engine does.
func (op *healingOperator) trigger(p *crawlv1alpha1.Proxy) {
	obj := &crawlv1alpha1.Proxy{}
	obj.Namespace, obj.Name = p.Namespace, p.Name
	op.triggers <- event.GenericEvent{Object: obj}
}

// TestSelfHealingGCP: VMs terminated or deleted behind the operator's back
// after their Proxy went Ready are replaced (same name, new IP), found by the
// instance watcher's List, with no watch and no spec change.
func TestSelfHealingGCP(t *testing.T) {
	env := testenv.Shared(t)
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{
		Provisioning: 100 * time.Millisecond, Staging: 100 * time.Millisecond, Stopping: 100 * time.Millisecond,
	})
	t.Cleanup(fake.Close)
	startHealingOperator(t, env, func(client.Client) providers.Set { return gcpProviders(t, fake) }, ReplacementPolicy{}, 0)
	ctx := context.Background()
	c := env.Client

	for _, tc := range []struct {
		name, reason string
		kill         func(zone, name string)
	}{
		{"terminated", ReasonInstanceFailed, func(zone, name string) { fake.SetStatus(zone, name, "TERMINATED") }},
		{"deleted", ReasonInstanceLost, func(zone, name string) { require.True(t, fake.Remove(zone, name)) }},
	} {
		t.Run("a VM "+tc.name+" after Ready is replaced", func(t *testing.T) {
			ns := env.Namespace(t)
			proxy := gcpManagedProxy(ns, "eu-"+tc.name)
			require.NoError(t, c.Create(ctx, proxy))
			before := waitReady(t, c, proxy)
			tc.kill("europe-west1-b", before.Status.InstanceName)

			after := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
				return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP != "" && p.Status.IP != before.Status.IP
			})
			assert.Equal(t, before.Status.InstanceName, after.Status.InstanceName, "same name")
			vms := vmsOf(fake, proxy)
			require.Len(t, vms, 1, "the dead VM is gone, one successor runs")
			assert.Equal(t, "RUNNING", vms[0].GetStatus())
			waitEvent(t, c, ns, proxy.Name, tc.reason)
		})
	}
}

// TestSelfHealingKubernetes: a proxy pod deleted behind the operator's back
// is replaced at once (pods are watched), with an Event saying so.
func TestSelfHealingKubernetes(t *testing.T) {
	env := testenv.Shared(t)
	startHealingOperator(t, env, func(c client.Client) providers.Set { return kubernetesProviders(t, c) }, ReplacementPolicy{}, 0)
	(&fakeKubelet{client: env.Client}).run(t)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)
	proxy := managedProxy(ns, "pod-deleted")
	require.NoError(t, c.Create(ctx, proxy))
	before := waitReady(t, c, proxy)
	pod := onlyPod(t, c, ns)
	require.NoError(t, c.Delete(ctx, &pod))

	after := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
		return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP != "" && p.Status.IP != before.Status.IP
	})
	assert.Equal(t, pod.Name, after.Status.InstanceName)
	waitEvent(t, c, ns, proxy.Name, ReasonInstanceLost)
}

// TestUnhealthyReplacement drives the reconciler with the engine's view as a
// test sets it: a proxy Unhealthy past its period is replaced, one within it
// is not; with many of the fleet failing at once none is replaced; and the
// bound on replacements in flight holds.
func TestUnhealthyReplacement(t *testing.T) {
	env := testenv.Shared(t)
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{
		Provisioning: 100 * time.Millisecond, Staging: 100 * time.Millisecond, Stopping: 300 * time.Millisecond,
	})
	t.Cleanup(fake.Close)
	policy := ReplacementPolicy{After: time.Minute, MaxUnhealthyShare: 0.3, HeldRecheck: 200 * time.Millisecond}
	op := startHealingOperator(t, env, func(client.Client) providers.Set { return gcpProviders(t, fake) }, policy, 1)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)

	const fleet = 10
	var ready []*crawlv1alpha1.Proxy
	for i := range fleet {
		p := gcpManagedProxy(ns, fmt.Sprintf("px-%d", i))
		require.NoError(t, c.Create(ctx, p))
		ready = append(ready, p)
	}
	for i, p := range ready {
		ready[i] = waitReady(t, c, p)
	}
	url := "https://probe.test/"
	set := func(p *crawlv1alpha1.Proxy, since time.Duration, unhealthy int) {
		var h ProxyHealth
		h.URL, h.Probed, h.Unhealthy = url, fleet, unhealthy
		if since > 0 {
			h.UnhealthySince = time.Now().Add(-since)
		}
		op.health.set(p, h)
		op.trigger(p)
	}

	t.Run("outage guard: 5 of 10 Unhealthy for long: none replaced, and the Event says why", func(t *testing.T) {
		for _, p := range ready[:5] {
			set(p, time.Hour, 5)
		}
		waitEvent(t, c, ns, ready[0].Name, ReasonProbeTargetSuspect)
		time.Sleep(time.Second)
		for _, p := range ready {
			var got crawlv1alpha1.Proxy
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(p), &got))
			assert.Equal(t, p.Status.IP, got.Status.IP, "%s was replaced during a suspected target outage", p.Name)
		}
		assert.Len(t, vmsIn(fake, ns), fleet, "no VM created or deleted")
	})

	t.Run("within the period: kept; past it: replaced, one at a time", func(t *testing.T) {
		// Another probe URL: time Unhealthy while the first was suspect does
		// not count toward replacement, by design (TestPlanAfterAnOutage).
		url = "https://another-probe.test/"
		set(ready[0], 10*time.Second, 3) // 3 of 10: not suspect
		for _, p := range ready[1:3] {
			set(p, time.Hour, 3)
		}
		for _, p := range ready[3:5] {
			set(p, 0, 3) // healthy again
		}
		// Sample the phases until both long-Unhealthy proxies have new IPs.
		maxReplacing := 0
		deadline := time.Now().Add(waitFor)
		for {
			var list crawlv1alpha1.ProxyList
			require.NoError(t, c.List(ctx, &list, client.InNamespace(ns)))
			replacing, replaced := 0, 0
			for i := range list.Items {
				got := &list.Items[i]
				if got.Status.Phase == crawlv1alpha1.PhaseReplacing {
					replacing++
				}
				for _, p := range ready[1:3] {
					if got.Name == p.Name && got.Status.Phase == crawlv1alpha1.PhaseReady && got.Status.IP != "" && got.Status.IP != p.Status.IP {
						replaced++
					}
				}
			}
			maxReplacing = max(maxReplacing, replacing)
			if replaced == 2 {
				break
			}
			if !time.Now().Before(deadline) {
				for i := range list.Items {
					t.Logf("%s: %s %s: %s", list.Items[i].Name, list.Items[i].Status.Phase, list.Items[i].Status.IP, list.Items[i].Status.Message)
				}
				t.Fatal("the two long-Unhealthy proxies were not both replaced")
			}
			time.Sleep(20 * time.Millisecond)
		}
		assert.Equal(t, 1, maxReplacing, "at most one replacement in flight at once (the bound)")
		waitEvent(t, c, ns, ready[1].Name, ReasonUnhealthy)
		waitEvent(t, c, ns, ready[2].Name, ReasonUnhealthy)
		assert.True(t, hasEvent(c, ns, ready[1].Name, ReasonReplacementsBusy) || hasEvent(c, ns, ready[2].Name, ReasonReplacementsBusy),
			"the second waited its turn, and its Event says so")
		var first crawlv1alpha1.Proxy
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(ready[0]), &first))
		assert.Equal(t, ready[0].Status.IP, first.Status.IP, "Unhealthy for 10s of a 1m period: kept")
	})
}

// conflictingClient loses a share of status writes to a conflict, as a
// fleet's concurrent writers (the health engine, a second pass) do.
type conflictingClient struct {
	client.Client
	share float64
}

func (c conflictingClient) Status() client.SubResourceWriter {
	return conflictingStatus{c.Client.Status(), c.share}
}

type conflictingStatus struct {
	client.SubResourceWriter
	share float64
}

func (s conflictingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if rand.Float64() < s.share {
		return apierrors.NewConflict(schema.GroupResource{Group: crawlv1alpha1.GroupVersion.Group, Resource: "proxies"}, obj.GetName(),
			errors.New("the object has been modified (injected)"))
	}
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

// TestLostWritesUnderConcurrentCreation creates many Proxies at once while
// a third of the status writes are lost to conflicts, and deletes half of
// them while they are still coming up: every survivor comes up with its
// instance recorded, and no deleted Proxy leaves a VM behind.
func TestLostWritesUnderConcurrentCreation(t *testing.T) {
	env := testenv.Shared(t)
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{
		Provisioning: 300 * time.Millisecond, Staging: 300 * time.Millisecond, Stopping: 100 * time.Millisecond,
	})
	t.Cleanup(fake.Close)
	mgr := newManager(t, env)
	require.NoError(t, (&ProxyReconciler{
		Client: conflictingClient{mgr.GetClient(), 0.35}, Providers: gcpProviders(t, fake), Owner: testOwner,
		Recorder: mgr.GetEventRecorder("egress-proxies-operator"), PollInterval: 100 * time.Millisecond,
		CredentialsCache: credentialsCache(t, mgr), CredentialsNamespace: testCredentialsNamespace,
	}).SetupWithManager(mgr))
	startManager(t, mgr)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)

	const n = 30
	proxies := make([]*crawlv1alpha1.Proxy, n)
	var wg sync.WaitGroup
	for i := range n {
		proxies[i] = gcpManagedProxy(ns, fmt.Sprintf("px-%d", i))
		wg.Go(func() { require.NoError(t, c.Create(ctx, proxies[i])) })
	}
	wg.Wait()
	// Half are deleted as soon as their instance exists, mid bring-up.
	for i := 0; i < n; i += 2 {
		p := proxies[i]
		require.Eventually(t, func() bool { return len(vmsOf(fake, p)) == 1 }, waitFor, tick)
		require.NoError(t, c.Delete(ctx, p))
	}
	for i := 0; i < n; i += 2 {
		p := proxies[i]
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(p), &crawlv1alpha1.Proxy{}))
		}, waitFor, tick, "%s was never deleted", p.Name)
		assert.Empty(t, vmsOf(fake, p), "%s: the finalizer came off while its VM existed", p.Name)
	}
	for i := 1; i < n; i += 2 {
		got := waitReady(t, c, proxies[i])
		vms := vmsOf(fake, proxies[i])
		require.Len(t, vms, 1, "%s: exactly one VM", got.Name)
		assert.Equal(t, vms[0].GetName(), got.Status.InstanceName)
		assert.Equal(t, "gcp-eu", got.Status.Provider)
		assert.Equal(t, vms[0].GetLabels()["crawl-spec-hash"], got.Status.SpecHash)
	}
	assert.Len(t, vmsIn(fake, ns), n/2, "nothing leaked, nothing duplicated")
}

// vmsIn lists the fake's VMs made for Proxies in ns: the shared API server
// holds other tests' Proxies too, which this test's operator reconciles.
func vmsIn(fake *fakecompute.Server, ns string) []*computepb.Instance {
	var out []*computepb.Instance
	for _, vm := range fake.Instances() {
		if vm.GetLabels()["crawl-owner-namespace"] == ns {
			out = append(out, vm)
		}
	}
	return out
}

// TestStartupTimeoutKubernetes: a proxy whose Squid container starts
// crash-looping after it was Ready leaves Ready (Provisioning, saying why)
// and, once the startup timeout passes, gets a new pod (same name, new
// IP), with a Warning Event saying why.
func TestStartupTimeoutKubernetes(t *testing.T) {
	env := testenv.Shared(t)
	startHealingOperator(t, env, func(c client.Client) providers.Set { return kubernetesProviders(t, c) },
		ReplacementPolicy{StartupTimeout: 2 * time.Second}, 0)
	(&fakeKubelet{client: env.Client}).run(t)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)
	proxy := managedProxy(ns, "crash-looping")
	require.NoError(t, c.Create(ctx, proxy))
	before := waitReady(t, c, proxy)
	pod := onlyPod(t, c, ns)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "squid", State: corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container"}}}}
	require.NoError(t, c.Status().Update(ctx, &pod))

	stuck := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseProvisioning })
	assert.Contains(t, stuck.Status.Message, "CrashLoopBackOff", "the status says what holds it")
	after := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
		return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP != "" && p.Status.IP != before.Status.IP
	})
	assert.Equal(t, pod.Name, after.Status.InstanceName, "same name")
	assert.NotEqual(t, pod.UID, onlyPod(t, c, ns).UID, "a new pod")
	waitEvent(t, c, ns, proxy.Name, ReasonStartupTimeout)
}
