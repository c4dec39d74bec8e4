// Package providertest is the conformance suite of the cloud providers:
// the gcp provider against its fake Compute API and the aws provider
// against its fake EC2 API run the same scenarios unchanged (create, a
// retried create, find by owner, delete, an instance lost after Ready, a
// crash between create and record, the firewall's lifecycle, the lease
// key's), which keeps
// every cloud honest to what the reconciler assumes of providers.Provider.
// It is test support: only _test files import it.
package providertest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
)

// Harness is one provider instance on an empty fake cloud of its own.
type Harness struct {
	// Name is the provider instance's name.
	Name string
	// Provider is the provider under test; it is Firewalled too.
	Provider providers.Provider
	// Restarted is the same provider instance built anew, as after an
	// operator restart: it shares the cloud and nothing else.
	Restarted func() providers.Provider
	// Placement is a placement this provider accepts.
	Placement crawlv1alpha1.Placement
	// Settle lets the cloud move on: pending instances boot, deleted ones
	// go.
	Settle func()
	// Lose ends the instance called name behind the operator's back, as a
	// preemption or a console click does.
	Lose func(name string)
	// Live counts the instances the cloud holds that are not deleted.
	Live func() int
	// Rules counts the firewall rules (security groups) the cloud holds.
	Rules func() int
	// LeaseKey is the lease key the cloud's secret store holds for the
	// instance called name, as the VM fetches it, and whether it holds one.
	LeaseKey func(name string) (string, bool)
	// UserData is what whoever may describe the instance called name reads
	// of it: its user-data and metadata, all in one string.
	UserData func(name string) string
}

// Owner is the operator the suite's instances belong to; Other is another.
var (
	Owner = providers.Owner{ClusterID: "cluster-1", OperatorID: "crawl-system_epo"}
	Other = providers.Owner{ClusterID: "cluster-2", OperatorID: "crawl-system_epo"}
)

// Credentials are the proxies' credentials in the suite.
var Credentials = credentials.Credentials{Username: "crawler", Password: "correct-horse-battery-staple"}

// Run runs every scenario, each on a harness of its own.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, h Harness)
	}{
		{"CreateIsIdempotent", createIsIdempotent},
		{"CrashBetweenCreateAndRecord", crashBetweenCreateAndRecord},
		{"ListFindsByOwner", listFindsByOwner},
		{"Delete", deleteScenario},
		{"LostAfterReady", lostAfterReady},
		{"FirewallLifecycle", firewallLifecycle},
		{"LeaseKeyFollowsTheInstance", leaseKeyFollowsTheInstance},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			require.NoError(t, firewalled(t, h.Provider).EnsureFirewall(context.Background(), Owner))
			tc.test(t, h)
		})
	}
}

// Proxy is a Managed Proxy of h's provider.
func (h Harness) Proxy(name string) *crawlv1alpha1.Proxy {
	placement := h.Placement
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name, UID: types.UID("uid-" + name)},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: h.Name, Port: 3128, Placement: &placement},
	}
}

// Request is the create request the reconciler would send for proxy under
// owner.
func (h Harness) Request(proxy *crawlv1alpha1.Proxy, owner providers.Owner, hash string) providers.CreateRequest {
	return providers.CreateRequest{
		Proxy: proxy, Name: providers.InstanceName(owner.ClusterID, proxy.Namespace, proxy.Name), SpecHash: hash, Credentials: Credentials,
		Labels: map[string]string{
			crawlv1alpha1.LabelClusterID: owner.ClusterID, crawlv1alpha1.LabelOperatorID: owner.OperatorID,
			crawlv1alpha1.LabelProvider: h.Name, crawlv1alpha1.LabelOwnerNamespace: proxy.Namespace,
			crawlv1alpha1.LabelOwnerName: proxy.Name, crawlv1alpha1.LabelOwnerUID: string(proxy.UID), crawlv1alpha1.LabelSpecHash: hash,
		},
	}
}

func firewalled(t *testing.T, p providers.Provider) providers.Firewalled {
	t.Helper()
	f, ok := p.(providers.Firewalled)
	require.True(t, ok, "a cloud provider keeps a firewall")
	return f
}

// running creates req's instance and waits for the cloud to run it.
func running(t *testing.T, h Harness, req providers.CreateRequest) *providers.Instance {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, h.Provider.Create(ctx, req))
	for range 10 {
		h.Settle()
		inst, err := h.Provider.Get(ctx, req.Name, req.Proxy)
		if err == nil && inst.State == providers.StateRunning {
			return inst
		}
		if err != nil && !errors.Is(err, providers.ErrNotFound) {
			require.NoError(t, err)
		}
	}
	t.Fatalf("instance %s never ran", req.Name)
	return nil
}

func createIsIdempotent(t *testing.T, h Harness) {
	ctx := context.Background()
	proxy := h.Proxy("eu-1")
	req := h.Request(proxy, Owner, "hash-1")
	require.NoError(t, h.Provider.Create(ctx, req))
	require.NoError(t, h.Provider.Create(ctx, req), "a retry after a lost reply")
	inst := running(t, h, req)
	assert.Equal(t, 1, h.Live(), "one instance for two creates")
	assert.Equal(t, req.Name, inst.Name)
	assert.NotEmpty(t, inst.IP)
	assert.Equal(t, int32(3128), inst.Port)
	assert.Equal(t, "hash-1", inst.SpecHash())
	assert.Equal(t, string(proxy.UID), inst.OwnerUID())
	assert.Equal(t, h.Name, inst.ProviderName())
	assert.False(t, inst.CreatedAt.IsZero())

	bare := h.Request(h.Proxy("eu-2"), Owner, "hash-1")
	bare.Credentials = credentials.Credentials{}
	require.ErrorIs(t, h.Provider.Create(ctx, bare), providers.ErrTerminal, "never an instance without credentials")
	assert.Equal(t, 1, h.Live())
}

func crashBetweenCreateAndRecord(t *testing.T, h Harness) {
	ctx := context.Background()
	proxy := h.Proxy("eu-1")
	req := h.Request(proxy, Owner, "hash-1")
	require.NoError(t, h.Provider.Create(ctx, req))
	// The operator dies before recording anything; its successor finds the
	// instance by name, and creating again makes no second one.
	again := h.Restarted()
	require.NoError(t, firewalled(t, again).EnsureFirewall(ctx, Owner))
	h.Settle()
	inst, err := again.Get(ctx, req.Name, proxy)
	require.NoError(t, err, "found by its name alone")
	assert.Equal(t, "hash-1", inst.SpecHash())
	require.NoError(t, again.Create(ctx, req))
	h.Settle()
	assert.Equal(t, 1, h.Live())
}

func listFindsByOwner(t *testing.T, h Harness) {
	ctx := context.Background()
	mine := []*providers.Instance{running(t, h, h.Request(h.Proxy("eu-1"), Owner, "hash-1")), running(t, h, h.Request(h.Proxy("eu-2"), Owner, "hash-1"))}
	running(t, h, h.Request(h.Proxy("eu-3"), Other, "hash-1"))
	listed, err := h.Provider.List(ctx, Owner)
	require.NoError(t, err)
	var names []string
	for _, inst := range listed {
		names = append(names, inst.Name)
	}
	assert.ElementsMatch(t, []string{mine[0].Name, mine[1].Name}, names, "the owner's instances, not another operator's")
	others, err := h.Provider.List(ctx, Other)
	require.NoError(t, err)
	assert.Len(t, others, 1)
}

func deleteScenario(t *testing.T, h Harness) {
	ctx := context.Background()
	req := h.Request(h.Proxy("eu-1"), Owner, "hash-1")
	inst := running(t, h, req)
	require.NoError(t, h.Provider.Delete(ctx, inst))
	require.NoError(t, h.Provider.Delete(ctx, inst), "deleting twice is fine")
	for range 10 {
		h.Settle()
		if _, err := h.Provider.Get(ctx, req.Name, req.Proxy); errors.Is(err, providers.ErrNotFound) {
			break
		}
	}
	_, err := h.Provider.Get(ctx, req.Name, req.Proxy)
	require.ErrorIs(t, err, providers.ErrNotFound, "deleted is gone")
	assert.Equal(t, 0, h.Live())
	require.NoError(t, h.Provider.Delete(ctx, inst), "deleting what is gone is fine")
}

func lostAfterReady(t *testing.T, h Harness) {
	ctx := context.Background()
	req := h.Request(h.Proxy("eu-1"), Owner, "hash-1")
	running(t, h, req)
	h.Lose(req.Name)
	inst, err := h.Provider.Get(ctx, req.Name, req.Proxy)
	if err == nil {
		// Failed, not gone: the reconciler deletes it before replacing it.
		require.Equal(t, providers.StateFailed, inst.State, "a lost instance is gone or failed: either way replaced")
		require.NoError(t, h.Provider.Delete(ctx, inst))
		for range 10 {
			h.Settle()
			if _, err = h.Provider.Get(ctx, req.Name, req.Proxy); err != nil {
				break
			}
		}
	}
	require.ErrorIs(t, err, providers.ErrNotFound)
	// Replaced under the same spec: a new instance comes up, though the
	// cloud remembers the first create's idempotency key.
	replacement := running(t, h, req)
	assert.Equal(t, providers.StateRunning, replacement.State)
	assert.Equal(t, 1, h.Live())
}

func firewallLifecycle(t *testing.T, h Harness) {
	ctx := context.Background()
	fw := firewalled(t, h.Provider)
	require.NoError(t, fw.EnsureFirewall(ctx, Owner), "again: nothing to do")
	assert.Equal(t, 1, h.Rules(), "one rule per provider instance and operator")
	require.NoError(t, fw.EnsureFirewall(ctx, Other))
	assert.Equal(t, 2, h.Rules(), "another operator keeps its own")

	kept, err := fw.StrayFirewalls(ctx, Owner, func(name string) bool { return name == h.Name })
	require.NoError(t, err)
	assert.Empty(t, kept, "the provider instance is configured: nothing stray")
	stray, err := fw.StrayFirewalls(ctx, Owner, func(string) bool { return false })
	require.NoError(t, err)
	require.Len(t, stray, 1, "the owner's rule alone, never another operator's")
	assert.Equal(t, h.Name, stray[0].Provider)
	require.NoError(t, fw.DeleteFirewall(ctx, stray[0]))
	assert.Equal(t, 1, h.Rules())
	require.NoError(t, fw.DeleteFirewall(ctx, stray[0]), "gone already")
}

// leaseKeyFollowsTheInstance: the instance's lease key is in the cloud's
// secret store from its create on, never in what describing the instance
// shows, and gone with the instance; a replacement (same name) gets it
// again.
func leaseKeyFollowsTheInstance(t *testing.T, h Harness) {
	ctx := context.Background()
	req := h.Request(h.Proxy("eu-1"), Owner, "hash-1")
	inst := running(t, h, req)
	key, ok := h.LeaseKey(req.Name)
	require.True(t, ok, "the lease key is stored before the instance boots")
	assert.Equal(t, req.LeaseKeyFile(), key)
	assert.NotContains(t, h.UserData(req.Name), strings.TrimSpace(key), "the key is nowhere a viewer of the instance reads")
	require.NoError(t, h.Provider.Create(ctx, req), "a retried create")
	key, _ = h.LeaseKey(req.Name)
	assert.Equal(t, req.LeaseKeyFile(), key)

	require.NoError(t, h.Provider.Delete(ctx, inst))
	_, ok = h.LeaseKey(req.Name)
	assert.False(t, ok, "the key goes with the instance")
	for i := 0; h.Live() > 0; i++ {
		require.Less(t, i, 10, "the deleted instance never went")
		h.Settle()
	}
	running(t, h, h.Request(h.Proxy("eu-1"), Owner, "hash-2"))
	key, ok = h.LeaseKey(req.Name)
	require.True(t, ok, "the replacement's key is stored again")
	assert.Equal(t, req.LeaseKeyFile(), key)
}
