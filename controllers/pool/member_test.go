package pool

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// TestManagedMembersAreBornWithTheFinalizer: a Managed member carries the
// instance-cleanup finalizer from its create, which saves the reconciler's
// first write; an External one, which has no instance, carries none.
func TestManagedMembersAreBornWithTheFinalizer(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, crawlv1alpha1.AddToScheme(scheme))
	for _, tc := range []struct {
		mode crawlv1alpha1.ProxyMode
		want bool
	}{{crawlv1alpha1.ModeManaged, true}, {crawlv1alpha1.ModeExternal, false}} {
		pool := &crawlv1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu", UID: "pool-uid"}}
		pool.Spec.Template.Spec = crawlv1alpha1.ProxySpec{Mode: tc.mode, Provider: "kind-local", Port: 3128}
		m, err := newMember(pool, "europe-west1-b", "hash", scheme)
		require.NoError(t, err)
		assert.Equal(t, tc.want, controllerutil.ContainsFinalizer(m, crawlv1alpha1.Finalizer), "mode %s", tc.mode)
	}
}

// TestMembersAcrossProviders: in a pool across providers, a member made
// for a slot gets that slot's provider and zone, and reads back as the
// same slot.
func TestMembersAcrossProviders(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, crawlv1alpha1.AddToScheme(scheme))
	pool := &crawlv1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "mixed", UID: "pool-uid"}}
	pool.Spec.Template.Spec = crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128}
	pool.Spec.Providers = []crawlv1alpha1.PoolProvider{{Name: "gcp-eu", Zones: []string{"europe-west1-b"}}, {Name: "aws-eu"}}
	for _, tc := range []struct{ slot, provider, zone string }{
		{SlotOf("aws-eu", ""), "aws-eu", ""},
		{SlotOf("gcp-eu", "europe-west1-b"), "gcp-eu", "europe-west1-b"},
	} {
		m, err := newMember(pool, tc.slot, "hash", scheme)
		require.NoError(t, err)
		assert.Equal(t, tc.provider, m.Spec.Provider)
		if tc.zone == "" {
			assert.Nil(t, m.Spec.Placement, "no zone: the provider's default")
		} else {
			assert.Equal(t, tc.zone, m.Spec.Placement.Zone)
		}
		in := inputOf(pool, 2, []crawlv1alpha1.Proxy{*m}, "hash", t0)
		require.Len(t, in.Members, 1)
		assert.Equal(t, tc.slot, in.Members[0].Zone, "read back as its slot")
		assert.Equal(t, []ProviderShare{{Name: "gcp-eu", Weight: 1, Zones: []string{"europe-west1-b"}}, {Name: "aws-eu", Weight: 1}}, in.Providers, "weights default to 1")
	}
}
