package gcp

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

var timings = fakecompute.Timings{Provisioning: 10 * time.Second, Staging: 10 * time.Second, Stopping: 10 * time.Second}

// newFake starts a fake Compute API and a provider whose real client talks
// to it.
func newFake(t *testing.T, mutate ...func(*Settings)) (*fakecompute.Server, *clocktesting.FakeClock, *Provider) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	fake := fakecompute.New(clk, timings)
	t.Cleanup(fake.Close)
	s := Settings{Project: "crawl-prod", Zone: "europe-west1-b", NetworkTags: []string{"egress-proxy"},
		Labels: map[string]string{"team": "crawl"}, RequestTimeout: "2s",
		ServiceAccount: testServiceAccount, SecretManagerEndpoint: fake.URL,
		Firewall: &FirewallSettings{SourceRanges: []string{"198.51.100.0/24", "203.0.113.0/24"}}}
	for _, m := range mutate {
		m(&s)
	}
	p, err := NewWithClientOptions("gcp-eu", s, option.WithEndpoint(fake.URL), option.WithoutAuthentication())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return fake, clk, p
}

// testServiceAccount is the VMs' service account in the tests.
const testServiceAccount = "egress-proxy-vm@crawl-prod.iam.gserviceaccount.com"

func gcpProxy(mutate ...func(*crawlv1alpha1.Proxy)) *crawlv1alpha1.Proxy {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1", UID: "0b0e8d4c-4a8e-4c4e-9d0e-6e8a6f1b2c3d"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
			Placement: &crawlv1alpha1.Placement{Zone: "europe-west1-b", MachineType: "e2-small", Image: "projects/debian-cloud/global/images/family/debian-12"}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

// testOwner is the operator the tests' instances belong to.
var testOwner = providers.Owner{ClusterID: "cluster-1", OperatorID: "crawl-system_epo"}

func createRequest(p *crawlv1alpha1.Proxy, hash string) providers.CreateRequest {
	name := providers.InstanceName(testOwner.ClusterID, p.Namespace, p.Name)
	return providers.CreateRequest{
		Proxy: p, Name: name, CloudInit: "#cloud-config\npackages: [squid]\n", SpecHash: hash,
		Credentials: testCredentials,
		Labels: map[string]string{
			crawlv1alpha1.LabelClusterID: testOwner.ClusterID, crawlv1alpha1.LabelOperatorID: testOwner.OperatorID,
			crawlv1alpha1.LabelOwnerNamespace: p.Namespace,
			crawlv1alpha1.LabelOwnerName:      p.Name, crawlv1alpha1.LabelOwnerUID: string(p.UID), crawlv1alpha1.LabelSpecHash: hash,
		},
	}
}

var testCredentials = credentials.Credentials{Username: "crawler", Password: "correct-horse-battery-staple"}

func fw(ranges ...string) map[string]any {
	out := make([]any, len(ranges))
	for i, r := range ranges {
		out[i] = r
	}
	return map[string]any{"sourceRanges": out}
}

func TestSettings(t *testing.T) {
	cases := []struct {
		name string
		raw  map[string]any
		want string
	}{
		{"project missing", map[string]any{"zone": "europe-west1-b", "firewall": fw("10.0.0.0/8")}, "settings.project is required"},
		{"firewall missing", map[string]any{"project": "p"}, "settings.firewall.sourceRanges is required"},
		{"firewall without ranges", map[string]any{"project": "p", "firewall": map[string]any{"sourceRanges": []any{}}}, "settings.firewall.sourceRanges is required"},
		{"firewall open to the internet", map[string]any{"project": "p", "firewall": fw("203.0.113.0/24", "0.0.0.0/0")}, `settings.firewall.sourceRanges[1]: "0.0.0.0/0" is the whole internet`},
		{"firewall open to the IPv6 internet", map[string]any{"project": "p", "firewall": fw("::/0")}, `settings.firewall.sourceRanges[0]: "::/0" is the whole internet`},
		{"firewall range not a CIDR", map[string]any{"project": "p", "firewall": fw("10.0.0.1")}, `settings.firewall.sourceRanges[0]: "10.0.0.1" is not a CIDR`},
		{"unknown field", map[string]any{"project": "p", "credentialsFile": "/key.json"}, `unknown field "credentialsFile"`},
		{"no auth without an endpoint", map[string]any{"project": "p", "withoutAuthentication": true}, "settings.withoutAuthentication needs settings.endpoint"},
		{"bad label", map[string]any{"project": "p", "labels": map[string]any{"Team": "crawl"}}, `settings.labels["Team"]`},
		{"label in the operator's namespace", map[string]any{"project": "p", "labels": map[string]any{"crawl-owner-uid": "x"}}, `settings.labels["crawl-owner-uid"]`},
		{"bad timeout", map[string]any{"project": "p", "requestTimeout": "soon"}, `settings.requestTimeout: "soon"`},
		{"no service account", map[string]any{"project": "p", "firewall": fw("10.0.0.0/8")}, "settings.serviceAccount is required: each VM fetches its lease key from Secret Manager"},
		{"scopes without cloud-platform", map[string]any{"project": "p", "serviceAccount": testServiceAccount, "scopes": []any{"https://www.googleapis.com/auth/logging.write"}, "firewall": fw("10.0.0.0/8")},
			"settings.scopes must include https://www.googleapis.com/auth/cloud-platform"},
		{"no auth without a Secret Manager endpoint", map[string]any{"project": "p", "endpoint": "http://127.0.0.1:1", "withoutAuthentication": true}, "settings.withoutAuthentication needs settings.endpoint and settings.secretManagerEndpoint"},
		{"too many session addresses", map[string]any{"project": "p", "ipv6": map[string]any{"sessionAddresses": 300}}, "settings.ipv6.sessionAddresses must be between 1 and 256, got 300"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New("gcp-eu", tc.raw, providers.Dependencies{})
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestValidate(t *testing.T) {
	_, _, p := newFake(t)
	assert.NoError(t, p.Validate(gcpProxy()))
	assert.NoError(t, p.Validate(gcpProxy(func(x *crawlv1alpha1.Proxy) { x.Spec.Placement.Zone = "" })), "the zone default applies")

	cases := []struct {
		name   string
		mutate func(*crawlv1alpha1.Proxy)
		want   string
	}{
		{"machineType missing", func(x *crawlv1alpha1.Proxy) { x.Spec.Placement.MachineType = "" }, "placement.machineType is required for gcp provider gcp-eu"},
		{"image missing", func(x *crawlv1alpha1.Proxy) { x.Spec.Placement.Image = "" }, "placement.image is required for gcp provider gcp-eu"},
		{"no placement at all", func(x *crawlv1alpha1.Proxy) { x.Spec.Placement = nil }, "placement.machineType is required"},
		{"unknown parameter", func(x *crawlv1alpha1.Proxy) { x.Spec.Placement.Parameters = map[string]string{"gpu": "1"} }, "placement.parameters.gpu is not known"},
		{"bad provisioning model", func(x *crawlv1alpha1.Proxy) {
			x.Spec.Placement.Parameters = map[string]string{"provisioningModel": "CHEAP"}
		}, "must be STANDARD or SPOT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Validate(gcpProxy(tc.mutate))
			assert.ErrorIs(t, err, providers.ErrTerminal)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestLifecycle(t *testing.T) {
	fake, clk, p := newFake(t)
	ctx := context.Background()
	proxy := gcpProxy()
	req := createRequest(proxy, "hash-1")

	_, err := p.Get(ctx, req.Name, proxy)
	assert.ErrorIs(t, err, providers.ErrNotFound)

	require.NoError(t, p.Create(ctx, req))
	vms := fake.Instances()
	require.Len(t, vms, 1)
	vm := vms[0]
	assert.Equal(t, req.Name, vm.GetName())
	assert.Equal(t, "zones/europe-west1-b/machineTypes/e2-small", vm.GetMachineType())
	assert.Equal(t, "projects/debian-cloud/global/images/family/debian-12", vm.GetDisks()[0].GetInitializeParams().GetSourceImage())
	assert.Equal(t, "user-data", vm.GetMetadata().GetItems()[0].GetKey())
	assert.Equal(t, req.CloudInit, vm.GetMetadata().GetItems()[0].GetValue())
	ac := vm.GetNetworkInterfaces()[0].GetAccessConfigs()
	require.Len(t, ac, 1)
	assert.Equal(t, "ONE_TO_ONE_NAT", ac[0].GetType())
	assert.Empty(t, ac[0].GetNatIP(), "ephemeral: the request names no address")
	assert.Equal(t, []string{TargetTag("gcp-eu"), "egress-proxy"}, vm.GetTags().GetItems(), "the operator's tag, which its firewall rule targets, then the configured ones")
	assert.Equal(t, map[string]string{
		"crawl-cluster-id": "cluster-1", "crawl-operator-id": "crawl-system_epo", "crawl-owner-namespace": "crawl", "crawl-owner-name": "eu-1",
		"crawl-owner-uid": string(proxy.UID), "crawl-spec-hash": "hash-1", "crawl-port": "3128", "team": "crawl",
		"crawl-provider": "gcp-eu",
	}, vm.GetLabels(), "the VM names the provider instance that made it, so only its own GC may collect it")

	inst, err := p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StatePending, inst.State, "PROVISIONING")
	assert.Equal(t, "europe-west1-b", inst.Location)
	assert.Equal(t, string(proxy.UID), inst.OwnerUID(), "labels read back in the operator's keys")
	assert.Equal(t, "hash-1", inst.SpecHash())

	clk.Step(timings.Provisioning)
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StatePending, inst.State, "STAGING")

	clk.Step(timings.Staging)
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateRunning, inst.State)
	assert.NotEmpty(t, inst.IP)
	assert.Equal(t, int32(3128), inst.Port)

	require.NoError(t, p.Delete(ctx, inst))
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateStopping, inst.State, "deletion is in flight")
	clk.Step(timings.Stopping)
	_, err = p.Get(ctx, req.Name, proxy)
	assert.ErrorIs(t, err, providers.ErrNotFound, "gone once deleted")
	assert.NoError(t, p.Delete(ctx, inst), "deleting what is gone is fine")
}

// TestADualStackVM: with settings.ipv6 a VM is dual-stack with an external
// IPv6 range (GCE checks the stack type and tier), its own cloud-init
// finds the range at boot, and the instance reports the range and its
// session addresses once it runs; VMs of one region share the
// subnetwork's /64, as on GCE.
func TestADualStackVM(t *testing.T) {
	fake, clk, p := newFake(t, func(s *Settings) { s.IPv6 = &squidconf.IPv6Egress{SessionAddresses: 8} })
	ctx := context.Background()
	var prefixes []netip.Prefix
	for _, name := range []string{"eu-1", "eu-2"} {
		proxy := gcpProxy(func(x *crawlv1alpha1.Proxy) { x.Name = name })
		req := createRequest(proxy, "hash-1")
		req.CloudInit = ""
		require.NoError(t, p.Create(ctx, req))
		clk.Step(timings.Provisioning + timings.Staging)
		inst, err := p.Get(ctx, req.Name, proxy)
		require.NoError(t, err)
		require.Equal(t, providers.StateRunning, inst.State)
		assert.Equal(t, int32(8), inst.SessionAddresses)
		prefix, err := netip.ParsePrefix(inst.IPv6Prefix)
		require.NoError(t, err, "a range: %q", inst.IPv6Prefix)
		assert.Equal(t, 96, prefix.Bits())
		prefixes = append(prefixes, prefix)
	}
	vm := fake.Instances()[0]
	iface := vm.GetNetworkInterfaces()[0]
	assert.Equal(t, "IPV4_IPV6", iface.GetStackType())
	require.Len(t, iface.GetIpv6AccessConfigs(), 1)
	assert.Equal(t, "DIRECT_IPV6", iface.GetIpv6AccessConfigs()[0].GetType())
	assert.Contains(t, vm.GetMetadata().GetItems()[0].GetValue(), "session-addresses.py", "the VM's cloud-init finds its range at boot")
	assert.NotEqual(t, prefixes[0], prefixes[1], "a range each")
	var rule netid.Rule
	assert.Equal(t, rule.Of(prefixes[0].Addr().String()), rule.Of(prefixes[1].Addr().String()), "one region's VMs share the subnetwork's /64: one sender")
}

func TestTerminatedIsReplacedAndStuckStoppingWaits(t *testing.T) {
	fake, clk, p := newFake(t)
	ctx := context.Background()
	proxy := gcpProxy()
	req := createRequest(proxy, "hash-1")
	require.NoError(t, p.Create(ctx, req))
	clk.Step(time.Minute)

	fake.SetStatus("europe-west1-b", req.Name, "TERMINATED")
	inst, err := p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateFailed, inst.State)
	fake.SetStatus("europe-west1-b", req.Name, "SUSPENDED")
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateFailed, inst.State)

	fake.StickInStopping(true)
	require.NoError(t, p.Delete(ctx, inst))
	clk.Step(time.Hour)
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateStopping, inst.State, "a delete that stays STOPPING is still in flight")
}

// TestLostInsertReply: the insert succeeds on the server but the reply never
// arrives; the retry carries the same requestId, so exactly one VM exists.
func TestLostInsertReply(t *testing.T) {
	fake, _, p := newFake(t)
	ctx := context.Background()
	proxy := gcpProxy()
	req := createRequest(proxy, "hash-1")

	fake.Inject(fakecompute.Fault{Method: "insert", LoseReply: true})
	err := p.Create(ctx, req)
	require.Error(t, err)
	assert.ErrorIs(t, err, providers.ErrTransient, "a lost reply is retried")
	assert.Equal(t, 1, fake.Created(), "the insert happened on the server")

	require.NoError(t, p.Create(ctx, req), "the retry is accepted")
	assert.Equal(t, 1, fake.Created(), "and created nothing more")
	assert.Len(t, fake.Instances(), 1)

	// A new spec is a new request: a different requestId.
	assert.NotEqual(t, RequestID(string(proxy.UID), "hash-1", "", 0), RequestID(string(proxy.UID), "hash-2", "", 0))
	assert.NotEqual(t, RequestID(string(proxy.UID), "hash-1", "", 0), RequestID(string(proxy.UID), "hash-1", "", 1), "a replacement is a new request")
	assert.NotEqual(t, "00000000-0000-0000-0000-000000000000", RequestID(string(proxy.UID), "hash-1", "", 0))
}

// TestReplacementWithTheSameSpecCreatesAVM: a VM lost (TERMINATED, then
// deleted) is replaced by one of the same spec. GCE remembers an insert's
// requestId for an hour at least and answers a repeat with the original,
// finished operation, creating nothing; Create must see that and insert
// under the next requestId, each time the spec's VM is replaced.
func TestReplacementWithTheSameSpecCreatesAVM(t *testing.T) {
	fake, clk, p := newFake(t)
	ctx := context.Background()
	proxy := gcpProxy()
	req := createRequest(proxy, "hash-1")
	for replacement := 1; replacement <= 3; replacement++ {
		require.NoError(t, p.Create(ctx, req))
		require.Equal(t, replacement, fake.Created(), "replacement %d created a VM", replacement)
		inst, err := p.Get(ctx, req.Name, proxy)
		require.NoError(t, err, "replacement %d: the VM exists", replacement)

		require.NoError(t, p.Delete(ctx, inst))
		clk.Step(timings.Stopping)
		_, err = p.Get(ctx, req.Name, proxy)
		require.ErrorIs(t, err, providers.ErrNotFound)
	}

	// A retry of the current insert still creates nothing.
	require.NoError(t, p.Create(ctx, req))
	require.NoError(t, p.Create(ctx, req))
	assert.Equal(t, 4, fake.Created())
	assert.Len(t, fake.Instances(), 1)
}

func TestGetFindsTheVMInAnotherZone(t *testing.T) {
	_, _, p := newFake(t)
	ctx := context.Background()
	proxy := gcpProxy()
	req := createRequest(proxy, "hash-1")
	require.NoError(t, p.Create(ctx, req))

	moved := gcpProxy(func(x *crawlv1alpha1.Proxy) { x.Spec.Placement.Zone = "europe-west4-a" })
	inst, err := p.Get(ctx, req.Name, moved)
	require.NoError(t, err, "after a zone change the old VM must still be found, to be deleted")
	assert.Equal(t, "europe-west1-b", inst.Location)
}

func TestListSelectsThisClusterAndOperator(t *testing.T) {
	fake, _, p := newFake(t)
	ctx := context.Background()
	for _, z := range []string{"europe-west1-b", "europe-west4-a"} {
		proxy := gcpProxy(func(x *crawlv1alpha1.Proxy) {
			x.Name, x.UID, x.Spec.Placement.Zone = "px-"+z, types.UID("uid-"+z), z
		})
		require.NoError(t, p.Create(ctx, createRequest(proxy, "h")))
	}
	for name, labels := range map[string]map[string]string{
		"px-other-cluster":  {"crawl-cluster-id": "cluster-2", "crawl-operator-id": testOwner.OperatorID, "crawl-provider": "gcp-eu"},
		"px-other-operator": {"crawl-cluster-id": testOwner.ClusterID, "crawl-operator-id": "tenant-b_epo", "crawl-provider": "gcp-eu"},
		"px-no-operator":    {"crawl-cluster-id": testOwner.ClusterID, "crawl-provider": "gcp-eu"},
	} {
		fake.PutInstance("europe-west1-b", &computepb.Instance{Name: proto.String(name), Labels: labels}, time.Now())
	}

	got, err := p.List(ctx, testOwner)
	require.NoError(t, err)
	require.Len(t, got, 2, "both zones, and neither the other cluster's, the other operator's nor an unowned VM")
	assert.ElementsMatch(t, []string{"europe-west1-b", "europe-west4-a"}, []string{got[0].Location, got[1].Location})
}

func TestNamesGCEAccepts(t *testing.T) {
	fake, _, p := newFake(t)
	ctx := context.Background()
	names := []string{"a", strings.Repeat("long-name-", 6) + "x", "x.y.z", "9-lives", strings.Repeat("z", 63)}
	for i, name := range names {
		proxy := gcpProxy(func(x *crawlv1alpha1.Proxy) {
			x.Name, x.UID, x.Namespace = name, types.UID(fmt.Sprintf("uid-%d", i)), "crawl-"+strings.Repeat("n", 40)
		})
		require.NoError(t, p.Create(ctx, createRequest(proxy, "h")), "GCE must accept the instance name for Proxy %q", name)
	}
	assert.Equal(t, len(names), fake.Created(), "one VM per Proxy, none de-duplicated away")
}

func TestErrorMapping(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		fault fakecompute.Fault
		call  string
		kind  error
		text  string
	}{
		{"503 on get, past the request timeout: transient", fakecompute.Fault{Method: "get", Status: http.StatusServiceUnavailable, Times: 1000}, "get", providers.ErrTransient, ""},
		{"429 on insert: transient", fakecompute.Fault{Method: "insert", Status: http.StatusTooManyRequests, Reason: "rateLimitExceeded"}, "create", providers.ErrTransient, ""},
		{"500 on delete: transient", fakecompute.Fault{Method: "delete", Status: http.StatusInternalServerError}, "delete", providers.ErrTransient, ""},
		{"403 on insert: terminal with the API's message", fakecompute.Fault{Method: "insert", Status: http.StatusForbidden, Reason: "forbidden",
			Message: "Required 'compute.instances.create' permission for 'projects/crawl-prod'"}, "create", providers.ErrTerminal, "Required 'compute.instances.create' permission"},
		{"400 on insert: terminal", fakecompute.Fault{Method: "insert", Status: http.StatusBadRequest, Reason: "invalid",
			Message: "Invalid value for field 'resource.machineType'"}, "create", providers.ErrTerminal, "Invalid value for field 'resource.machineType'"},
		{"quota on insert: named as such", fakecompute.Fault{Method: "insert", Status: http.StatusForbidden, Reason: "quotaExceeded",
			Message: "Quota 'CPUS' exceeded. Limit: 8.0 in region europe-west1."}, "create", providers.ErrQuota, "quota exceeded: Quota 'CPUS' exceeded"},
		{"quota failing the insert operation: named as such", fakecompute.Fault{Method: "insert", OperationError: "QUOTA_EXCEEDED",
			Message: "Quota 'IN_USE_ADDRESSES' exceeded."}, "create", providers.ErrQuota, "quota exceeded creating VM"},
		{"a full zone failing the insert operation: no capacity", fakecompute.Fault{Method: "insert", OperationError: "ZONE_RESOURCE_POOL_EXHAUSTED",
			Message: "The zone 'projects/crawl-prod/zones/europe-west1-b' does not have enough resources available to fulfill the request."}, "create", providers.ErrCapacity, "no capacity for VM"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, _, p := newFake(t, func(s *Settings) { s.RequestTimeout = "500ms" })
			proxy := gcpProxy()
			req := createRequest(proxy, "hash-1")
			if tc.call == "delete" || tc.call == "get" {
				require.NoError(t, p.Create(ctx, req))
			}
			fake.Inject(tc.fault)
			var err error
			switch tc.call {
			case "create":
				err = p.Create(ctx, req)
			case "get":
				_, err = p.Get(ctx, req.Name, proxy)
			case "delete":
				err = p.Delete(ctx, &providers.Instance{Name: req.Name, Location: "europe-west1-b"})
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.kind)
			if tc.text != "" {
				assert.Contains(t, providers.TerminalMessage(err), tc.text)
			}
		})
	}

	t.Run("409 on a name clash: the VM exists, Create succeeds", func(t *testing.T) {
		fake, _, p := newFake(t)
		proxy := gcpProxy()
		req := createRequest(proxy, "hash-1")
		fake.PutInstance("europe-west1-b", &computepb.Instance{Name: proto.String(req.Name)}, time.Now())
		assert.NoError(t, p.Create(ctx, req))
		assert.Equal(t, 1, fake.Created())
	})

	t.Run("a 503 the client retries past is not an error", func(t *testing.T) {
		fake, _, p := newFake(t)
		proxy := gcpProxy()
		req := createRequest(proxy, "hash-1")
		require.NoError(t, p.Create(ctx, req))
		fake.Inject(fakecompute.Fault{Method: "get", Status: http.StatusServiceUnavailable, Times: 2})
		_, err := p.Get(ctx, req.Name, proxy)
		assert.NoError(t, err)
	})
}
