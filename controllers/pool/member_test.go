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
