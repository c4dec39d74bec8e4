package pool_test

import (
	"context"
	"os"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/controllers/pool"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopShared()
	os.Exit(code)
}

var zones = []string{"europe-west1-b", "europe-west1-c", "europe-west1-d"}

// gcpPools runs the pool controller and the Proxy reconciler on the
// shared API server, with the gcp provider's real Compute client talking to
// a fake Compute API; it returns the fake, a client, a namespace of the
// test's own and a context ending with the test.
func gcpPools(t *testing.T) (*fakecompute.Server, client.Client, string, context.Context) {
	t.Helper()
	env := testenv.Shared(t)
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{
		Provisioning: 100 * time.Millisecond, Staging: 100 * time.Millisecond, Stopping: 100 * time.Millisecond,
	})
	t.Cleanup(fake.Close)
	prov, err := gcp.NewWithClientOptions("gcp-eu", gcp.Settings{
		Project: "crawl-prod", Zone: zones[0], Image: "projects/debian-cloud/global/images/family/debian-12", MachineType: "e2-small",
		RequestTimeout: "2s", Firewall: &gcp.FirewallSettings{SourceRanges: []string{"127.0.0.0/8"}},
		ServiceAccount: "egress-proxy-vm@crawl-prod.iam.gserviceaccount.com",
	}, option.WithEndpoint(fake.URL), option.WithoutAuthentication())
	require.NoError(t, err)
	t.Cleanup(func() { _ = prov.Close() })

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Cache: cache.Options{ByObject: controllers.CacheByObject()},
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: withSkipNameValidation(controllers.ControllerDefaults()),
	})
	require.NoError(t, err)
	credsCache, err := cache.New(mgr.GetConfig(), credentials.CacheOptions(cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()}))
	require.NoError(t, err)
	require.NoError(t, mgr.Add(credsCache))
	recorder := mgr.GetEventRecorder("egress-proxies-operator")
	require.NoError(t, (&controllers.ProxyReconciler{
		Client: mgr.GetClient(), Providers: providers.Set{"gcp-eu": prov}, Owner: providers.Owner{ClusterID: "test-cluster", OperatorID: "test-system_epo"}, Recorder: recorder,
		PollInterval: 100 * time.Millisecond, CredentialsCache: credsCache, CredentialsNamespace: "default",
	}).SetupWithManager(mgr))
	require.NoError(t, (&pool.Reconciler{Client: mgr.GetClient(), Recorder: recorder}).SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))

	c := env.Client
	ns := env.Namespace(t)
	go markHealthy(ctx, c, ns)
	return fake, c, ns, ctx
}

// TestGCPPoolSpreadsAndRecycles runs the pool controller beside the real
// Proxy reconciler and gcp provider, whose real Compute client talks to the
// fake Compute API: a pool of 6 over three zones gets two VMs in each, and
// with a maxAge every member is recycled (a new VM, the old one deleted)
// while never fewer than 6 are available.
//
// Probes are not the subject here (the e2e suite probes real Squid through
// real pods): a stand-in marks each Ready member's Healthy condition True
// once its VM runs, as the engine would once its first probe passed.
func TestGCPPoolSpreadsAndRecycles(t *testing.T) {
	fake, c, ns, ctx := gcpPools(t)

	p := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eu"},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr.To[int32](6), Zones: zones,
			MaxAge: &metav1.Duration{Duration: 30 * time.Second}, MaxAgeJitterPercent: 0,
			Strategy: crawlv1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(2))},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
				Placement: &crawlv1alpha1.Placement{Region: "europe-west1"},
			}},
		},
	}
	require.NoError(t, c.Create(ctx, p))

	var first map[string]bool
	require.Eventually(t, func() bool {
		ms := listMembers(t, c, p)
		first = map[string]bool{}
		for _, m := range ms {
			first[m.Name] = true
		}
		return len(ms) == 6 && available(ms) == 6
	}, 20*time.Second, 100*time.Millisecond, "6 members available")
	assert.Equal(t, map[string]int{zones[0]: 2, zones[1]: 2, zones[2]: 2}, vmsPerZone(fake), "two VMs in each zone")

	// Sample the floor until every first member is gone.
	fewest := 1 << 30
	deadline := time.Now().Add(90 * time.Second)
	for {
		ms := listMembers(t, c, p)
		fewest = min(fewest, available(ms))
		recycled := available(ms) >= 6
		for _, m := range ms {
			recycled = recycled && !first[m.Name]
		}
		if recycled {
			break
		}
		require.True(t, time.Now().Before(deadline), "every member was never recycled; members now: %v", memberNames(ms))
		time.Sleep(200 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, fewest, 6, "never below replicas - maxUnavailable available while recycling")
	// Stop the next round, then let the last deletions finish.
	require.NoError(t, patch(ctx, c, p, func(p *crawlv1alpha1.ProxyPool) { p.Spec.MaxAge = nil }))
	require.Eventually(t, func() bool {
		per := vmsPerZone(fake)
		return per[zones[0]] == 2 && per[zones[1]] == 2 && per[zones[2]] == 2 && len(fake.Instances()) == 6
	}, 30*time.Second, 100*time.Millisecond, "the old VMs are deleted and the spread kept: %v", vmsPerZone(fake))

	require.NoError(t, c.Delete(ctx, p))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(p), &crawlv1alpha1.ProxyPool{})) && len(fake.Instances()) == 0
	}, 30*time.Second, 100*time.Millisecond, "deleting the pool deletes every member's VM")
}

// TestAFullZoneMovesMembersToTheNext: a zone whose inserts fail with
// ZONE_RESOURCE_POOL_EXHAUSTED gets no member: the members refused there
// are replaced in the pool's other zone, the pool says so (PlacementLimited,
// a PlacementFull Event), and the full zone is not tried again in a loop.
func TestAFullZoneMovesMembersToTheNext(t *testing.T) {
	fake, c, ns, ctx := gcpPools(t)
	fake.Inject(fakecompute.Fault{Method: "insert", Zone: zones[1], OperationError: "ZONE_RESOURCE_POOL_EXHAUSTED",
		Message: "The zone does not have enough resources available to fulfill the request.", Times: 1000})
	p := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "full"},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr.To[int32](4), Zones: zones[:2],
			Strategy: crawlv1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(2))},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
				Placement: &crawlv1alpha1.Placement{Region: "europe-west1"},
			}},
		},
	}
	createPool(ctx, t, c, p)
	require.Eventually(t, func() bool {
		ms := listMembers(t, c, p)
		return len(ms) == 4 && available(ms) == 4
	}, 30*time.Second, 100*time.Millisecond, "4 members available in the zone with room")
	assert.Equal(t, map[string]int{zones[0]: 4}, vmsPerZone(fake), "every VM in the zone with room")
	var got crawlv1alpha1.ProxyPool
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(p), &got))
	limited := meta.FindStatusCondition(got.Status.Conditions, crawlv1alpha1.ConditionPlacementLimited)
	require.NotNil(t, limited)
	assert.Equal(t, metav1.ConditionTrue, limited.Status)
	assert.Contains(t, limited.Message, "zone "+zones[1])
	require.Eventually(t, func() bool { return hasEvent(ctx, c, ns, "PlacementFull") }, 10*time.Second, 100*time.Millisecond, "a PlacementFull Event")
	// Settled, and the full zone left alone: the two first members were
	// refused there, and no other member was sent there.
	assert.Equal(t, 2, fake.Attempted(zones[1]), "VMs asked of the full zone: its first two members only, never in a loop")
}

// TestSpotFallsBackToStandard: with placementFallback.standardForSpot, Spot
// members refused for capacity are replaced in their zone by standard
// VMs, and the pool says so.
func TestSpotFallsBackToStandard(t *testing.T) {
	fake, c, ns, ctx := gcpPools(t)
	fake.Inject(fakecompute.Fault{Method: "insert", Zone: zones[0], OperationError: "ZONE_RESOURCE_POOL_EXHAUSTED",
		Message: "The zone does not have enough Spot resources available to fulfill the request.", Times: 2})
	p := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spot"},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr.To[int32](2), Zones: zones[:1],
			Strategy:          crawlv1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(2))},
			PlacementFallback: &crawlv1alpha1.PlacementFallback{StandardForSpot: true},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
				Placement: &crawlv1alpha1.Placement{Region: "europe-west1", Parameters: map[string]string{"provisioningModel": "SPOT"}},
			}},
		},
	}
	createPool(ctx, t, c, p)
	require.Eventually(t, func() bool {
		ms := listMembers(t, c, p)
		return len(ms) == 2 && available(ms) == 2
	}, 30*time.Second, 100*time.Millisecond, "2 members available")
	for _, m := range listMembers(t, c, p) {
		assert.False(t, m.Spec.Placement.IsSpot(), "member %s: standard", m.Name)
		assert.Equal(t, zones[0], m.Spec.Placement.Zone, "in the same zone")
	}
	for _, vm := range fake.Instances() {
		assert.NotEqual(t, "SPOT", vm.GetScheduling().GetProvisioningModel(), "VM %s", vm.GetName())
	}
	var got crawlv1alpha1.ProxyPool
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(p), &got))
	limited := meta.FindStatusCondition(got.Status.Conditions, crawlv1alpha1.ConditionPlacementLimited)
	require.NotNil(t, limited)
	assert.Equal(t, "SpotFallback", limited.Reason)
	assert.Contains(t, limited.Message, "no Spot capacity in zone "+zones[0])
	require.Eventually(t, func() bool { return hasEvent(ctx, c, ns, "SpotFallback") }, 10*time.Second, 100*time.Millisecond, "a SpotFallback Event")
}

// createPool creates p, and deletes it when the test ends, waiting for its
// members to go while the test's manager still runs: every test's manager
// sees every namespace, and a pool left behind would draw on the next
// test's fake.
func createPool(ctx context.Context, t *testing.T, c client.Client, p *crawlv1alpha1.ProxyPool) {
	t.Helper()
	require.NoError(t, c.Create(ctx, p))
	t.Cleanup(func() {
		require.NoError(t, client.IgnoreNotFound(c.Delete(ctx, p)))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(p), &crawlv1alpha1.ProxyPool{}))
		}, 30*time.Second, 100*time.Millisecond, "pool %s deleted with its members", p.Name)
	})
}

// hasEvent says whether an Event with reason was recorded in ns.
func hasEvent(ctx context.Context, c client.Client, ns, reason string) bool {
	var list eventsv1.EventList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return false
	}
	for _, e := range list.Items {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

func listMembers(t *testing.T, c client.Client, p *crawlv1alpha1.ProxyPool) []crawlv1alpha1.Proxy {
	t.Helper()
	var list crawlv1alpha1.ProxyList
	require.NoError(t, c.List(context.Background(), &list, client.InNamespace(p.Namespace), client.MatchingLabels{crawlv1alpha1.LabelPool: p.Name}))
	return list.Items
}

func available(ms []crawlv1alpha1.Proxy) int {
	n := 0
	for _, m := range ms {
		if m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, crawlv1alpha1.ConditionReady) {
			n++
		}
	}
	return n
}

func memberNames(ms []crawlv1alpha1.Proxy) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// vmsPerZone counts the fake's running or starting VMs by zone.
func vmsPerZone(fake *fakecompute.Server) map[string]int {
	out := map[string]int{}
	for _, vm := range fake.Instances() {
		if !strings.HasPrefix(vm.GetStatus(), "STOP") && vm.GetStatus() != "TERMINATED" {
			out[path.Base(vm.GetZone())]++
		}
	}
	return out
}

// markHealthy plays the health engine's first passing probe: each Ready
// proxy with an address whose Healthy condition is not True gets it.
func markHealthy(ctx context.Context, c client.Client, ns string) {
	for ctx.Err() == nil {
		var list crawlv1alpha1.ProxyList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err == nil {
			for i := range list.Items {
				px := &list.Items[i]
				if !px.Serving() || px.IsReady() {
					continue
				}
				_ = testenv.ApplyHealth(ctx, c, px, metav1.ConditionTrue, "ProbeSucceeded", "stand-in for the engine's first passing probe")
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func patch(ctx context.Context, c client.Client, p *crawlv1alpha1.ProxyPool, edit func(*crawlv1alpha1.ProxyPool)) error {
	var err error
	for range 20 {
		var cur crawlv1alpha1.ProxyPool
		if err = c.Get(ctx, client.ObjectKeyFromObject(p), &cur); err != nil {
			return err
		}
		edit(&cur)
		if err = c.Update(ctx, &cur); !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

// withSkipNameValidation lets several managers in one test binary run
// controllers of the same name, one after another.
func withSkipNameValidation(c config.Controller) config.Controller {
	c.SkipNameValidation = ptr.To(true)
	return c
}
