package controllers

import (
	"context"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// gcpProviders is a provider set with one gcp instance, gcp-eu, whose real
// Compute client talks to fake.
func gcpProviders(t *testing.T, fake *fakecompute.Server) providers.Set {
	t.Helper()
	return providers.Set{"gcp-eu": gcpProvider(t, fake, "gcp-eu", "europe-west1-b")}
}

// gcpProvider is one gcp provider instance in the project crawl-prod, whose
// real Compute client talks to fake.
func gcpProvider(t *testing.T, fake *fakecompute.Server, name, zone string) *gcp.Provider {
	t.Helper()
	p, err := gcp.NewWithClientOptions(name, gcp.Settings{
		Project: "crawl-prod", Zone: zone, Image: "projects/debian-cloud/global/images/family/debian-12",
		RequestTimeout: "2s", Firewall: &gcp.FirewallSettings{SourceRanges: []string{"127.0.0.0/8"}},
		ServiceAccount: "egress-proxy-vm@crawl-prod.iam.gserviceaccount.com",
	}, option.WithEndpoint(fake.URL), option.WithoutAuthentication())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func gcpManagedProxy(ns, name string) *crawlv1alpha1.Proxy {
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{
			Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
			Attributes: map[string]string{"geo": "eu"},
			Placement:  &crawlv1alpha1.Placement{Zone: "europe-west1-b", MachineType: "e2-small"},
		},
	}
}

// vmsOf lists the fake's VMs made for the Proxy (by owner label).
func vmsOf(fake *fakecompute.Server, p *crawlv1alpha1.Proxy) []*computepb.Instance {
	var out []*computepb.Instance
	for _, vm := range fake.Instances() {
		if vm.GetLabels()["crawl-owner-name"] == p.Name && vm.GetLabels()["crawl-owner-namespace"] == p.Namespace {
			out = append(out, vm)
		}
	}
	return out
}

// TestReconcilerGCP runs the real controller with the gcp provider, whose
// real client talks to the fake Compute API on a real clock with short
// timings.
func TestReconcilerGCP(t *testing.T) {
	env := testenv.Shared(t)
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{
		Provisioning: 150 * time.Millisecond, Staging: 150 * time.Millisecond, Stopping: 150 * time.Millisecond,
	})
	t.Cleanup(fake.Close)
	startReconciler(t, env, func(client.Client) providers.Set { return gcpProviders(t, fake) })
	ctx := context.Background()
	c := env.Client

	t.Run("create -> Ready with the VM's external IP; placement change -> same name, new IP; delete", func(t *testing.T) {
		ns := env.Namespace(t)
		proxy := gcpManagedProxy(ns, "eu-1")
		require.NoError(t, c.Create(ctx, proxy))
		ready := waitReady(t, c, proxy)
		vms := vmsOf(fake, proxy)
		require.Len(t, vms, 1)
		assert.Equal(t, vms[0].GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP(), ready.Status.IP)
		assert.Equal(t, providers.InstanceName(testOwner.ClusterID, ns, "eu-1"), vms[0].GetName())
		assert.Equal(t, "gcp-eu", ready.Status.Provider)

		ready.Spec.Placement.MachineType = "e2-medium"
		require.NoError(t, c.Update(ctx, ready))
		replaced := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
			return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.SpecHash != ready.Status.SpecHash
		})
		vms = vmsOf(fake, proxy)
		require.Len(t, vms, 1)
		assert.Equal(t, ready.Status.InstanceName, vms[0].GetName(), "same name")
		assert.Contains(t, vms[0].GetMachineType(), "e2-medium")
		assert.NotEqual(t, ready.Status.IP, replaced.Status.IP, "new IP")
		waitEvent(t, c, ns, "eu-1", ReasonSpecChanged)

		require.NoError(t, c.Delete(ctx, replaced))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(proxy), &crawlv1alpha1.Proxy{}))
		}, waitFor, tick, "the finalizer was never removed")
		assert.Empty(t, vmsOf(fake, proxy), "the VM outlived its Proxy")
	})

	t.Run("cloud-init Secret rotation -> replaced", func(t *testing.T) {
		ns := env.Namespace(t)
		secret := createCloudInitSecret(t, c, ns)
		proxy := withSecretCloudInit(gcpManagedProxy(ns, "eu-2"), secret)
		require.NoError(t, c.Create(ctx, proxy))
		before := waitReady(t, c, proxy)

		secret.Data["user-data"] = []byte("#cloud-config\npackages: [squid, curl]\n")
		require.NoError(t, c.Update(ctx, secret))
		waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
			return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.SpecHash != before.Status.SpecHash
		})
		vms := vmsOf(fake, proxy)
		require.Len(t, vms, 1)
		assert.Contains(t, vms[0].GetMetadata().GetItems()[0].GetValue(), "curl", "the new VM boots the new cloud-init")
	})

	t.Run("missing machineType -> Failed naming the field, and no VM", func(t *testing.T) {
		ns := env.Namespace(t)
		inserts := fake.Requests("insert")
		proxy := gcpManagedProxy(ns, "eu-3")
		proxy.Spec.Placement.MachineType = ""
		require.NoError(t, c.Create(ctx, proxy))
		failed := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseFailed })
		cond := meta.FindStatusCondition(failed.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
		require.NotNil(t, cond)
		assert.Equal(t, ReasonInvalidPlacement, cond.Reason)
		assert.Contains(t, cond.Message, "placement.machineType is required for gcp provider gcp-eu")
		assert.Empty(t, vmsOf(fake, proxy))
		assert.Equal(t, inserts, fake.Requests("insert"), "no insert was attempted")
	})

	t.Run("quota exhausted -> Failed with the quota named", func(t *testing.T) {
		ns := env.Namespace(t)
		// Exhausted quota stays exhausted: every insert fails, including a
		// retry after a pass whose Failed record was lost to a conflict.
		fake.Inject(fakecompute.Fault{Method: "insert", Status: http.StatusForbidden, Reason: "quotaExceeded",
			Message: "Quota 'CPUS' exceeded. Limit: 8.0 in region europe-west1.", Times: 100})
		proxy := gcpManagedProxy(ns, "eu-4")
		require.NoError(t, c.Create(ctx, proxy))
		failed := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseFailed })
		assert.Contains(t, failed.Status.Message, "quota exceeded: Quota 'CPUS' exceeded")
	})
}

func TestOrphanCollectorGCP(t *testing.T) {
	env := testenv.Shared(t)
	clk := clocktesting.NewFakeClock(time.Now())
	fake := fakecompute.New(clk, fakecompute.Timings{})
	t.Cleanup(fake.Close)
	ns := env.Namespace(t)
	// A live Proxy of gcp-us, the second gcp provider instance in the same
	// project (as the shipped sample config has it).
	live := gcpManagedProxy(ns, "live-us")
	live.Spec.Provider = "gcp-us"
	require.NoError(t, env.Client.Create(context.Background(), live))
	labels := func(owner providers.Owner, provider, name, uid string) map[string]string {
		l := map[string]string{"crawl-cluster-id": owner.ClusterID, "crawl-operator-id": owner.OperatorID,
			"crawl-owner-namespace": ns, "crawl-owner-name": name, "crawl-owner-uid": uid}
		if provider != "" {
			l["crawl-provider"] = provider
		}
		return l
	}
	iface := []*computepb.NetworkInterface{{AccessConfigs: []*computepb.AccessConfig{{Type: proto.String("ONE_TO_ONE_NAT")}}}}
	put := func(zone, name string, labels map[string]string) {
		fake.PutInstance(zone, &computepb.Instance{Name: proto.String(name), Labels: labels, NetworkInterfaces: iface}, clk.Now())
	}
	put("europe-west1-b", "px-orphan", labels(testOwner, "gcp-eu", "gone", "uid-gone"))
	put("europe-west4-a", "px-foreign", labels(providers.Owner{ClusterID: "other-cluster", OperatorID: testOwner.OperatorID}, "gcp-eu", "gone", "uid-gone"))
	put("europe-west4-a", "px-other-operator", labels(providers.Owner{ClusterID: testOwner.ClusterID, OperatorID: "tenant-b_epo"}, "gcp-eu", "gone", "uid-gone"))
	put("us-central1-a", "px-live-us", labels(testOwner, "gcp-us", "live-us", string(live.UID)))
	put("europe-west1-b", "px-legacy", labels(testOwner, "", "gone", "uid-gone"))
	put("europe-west1-b", "px-legacy-operator", labels(providers.Owner{ClusterID: testOwner.ClusterID}, "gcp-eu", "gone", "uid-gone"))

	mgr := newManager(t, env)
	startManager(t, mgr)
	set := twoGCPProviders(t, fake)
	gc := &OrphanCollector{Client: mgr.GetClient(), Providers: set, Owner: testOwner,
		GracePeriod: 3 * time.Minute, Clock: clk}
	clk.Step(4 * time.Minute)
	for range 3 {
		require.NoError(t, gc.Sweep(context.Background()))
		clk.Step(time.Second) // let the fake finish the deletion
	}
	var names []string
	for _, vm := range fake.Instances() {
		names = append(names, vm.GetName())
	}
	assert.ElementsMatch(t, []string{"px-foreign", "px-other-operator", "px-live-us", "px-legacy", "px-legacy-operator"}, names,
		"gcp-eu's orphan is collected; the other cluster's and the other operator's VMs, gcp-us's live VM and the unlabelled VMs are not, over several sweeps")
}

// twoGCPProviders is gcp-eu and gcp-us in one project, on one fake.
func twoGCPProviders(t *testing.T, fake *fakecompute.Server) providers.Set {
	t.Helper()
	set := gcpProviders(t, fake)
	set["gcp-us"] = gcpProvider(t, fake, "gcp-us", "us-central1-a")
	return set
}

// TestCrashSafetyGCP runs the crash-safety scenario against the fake Compute
// API with faults: the first insert's reply is lost, Gets and deletes meet
// 503s. Never two VMs for one Proxy, none left after delete.
func TestCrashSafetyGCP(t *testing.T) {
	runCrashScenario(t, func(t *testing.T, ns string) crashScenario {
		clk := clocktesting.NewFakeClock(time.Now())
		fake := fakecompute.New(clk, fakecompute.Timings{Provisioning: time.Second, Staging: time.Second, Stopping: time.Second})
		t.Cleanup(fake.Close)
		fake.Inject(fakecompute.Fault{Method: "insert", LoseReply: true})
		fake.Inject(fakecompute.Fault{Method: "insert", Status: http.StatusServiceUnavailable})
		fake.Inject(fakecompute.Fault{Method: "get", Status: http.StatusServiceUnavailable, Times: 3})
		fake.Inject(fakecompute.Fault{Method: "delete", Status: http.StatusServiceUnavailable})
		fake.Inject(fakecompute.Fault{Method: "delete", LoseReply: true})
		set := gcpProviders(t, fake)
		proxy := gcpManagedProxy(ns, "crashy")
		return crashScenario{
			proxy:     proxy,
			providers: func(*testing.T, client.Client) providers.Set { return set },
			between:   func(*testing.T) { clk.Step(time.Second) },
			instances: func(*testing.T) int { return len(vmsOf(fake, proxy)) },
			change:    func(p *crawlv1alpha1.Proxy) { p.Spec.Placement.MachineType = "e2-medium" },
			verify: func(t *testing.T) {
				assert.Zero(t, fake.PendingFaults(), "every injected fault was met")
				assert.Equal(t, 2, fake.Created(), "one VM per spec: the lost reply's retry created nothing")
			},
		}
	})
}
