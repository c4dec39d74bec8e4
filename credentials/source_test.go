package credentials

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// TestLookupTellsTheUsersFaultFromAPassingOne: a missing or stale Secret is
// for the user to fix; a cache that cannot answer yet is for a retry, and
// the reconciler must not report it as the user's fault.
func TestLookupTellsTheUsersFaultFromAPassingOne(t *testing.T) {
	good := Generate()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "creds", Labels: map[string]string{crawlv1alpha1.LabelSpecHash: "abc"}},
		Data:       good.Data(),
	}
	legacy := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "px-instance", Labels: map[string]string{crawlv1alpha1.LabelSpecHash: "abc"}},
		Data:       good.Data(),
	}
	present := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(secret, legacy).Build()
	notStarted := interceptor.NewClient(present, interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return &cache.ErrCacheNotStarted{}
		},
	})
	ctx := context.Background()

	for _, tc := range []struct {
		name   string
		reader client.Reader
		ref    Ref
		want   error
	}{
		{"found", present, Ref{Namespace: "ns", Name: "creds"}, nil},
		{"found for this spec", present, Ref{Namespace: "ns", Name: "creds", SpecHash: "abc"}, nil},
		{"missing", present, Ref{Namespace: "ns", Name: "other"}, ErrNotFound},
		{"another spec's", present, Ref{Namespace: "ns", Name: "creds", SpecHash: "def"}, ErrNotFound},
		{"cache not started", notStarted, Ref{Namespace: "ns", Name: "creds"}, ErrUnavailable},
		{"missing, an earlier version's record for this spec", present, Ref{Namespace: "ns", Name: "other", SpecHash: "abc", Legacy: "px-instance"}, nil},
		{"missing, an earlier version's record for another spec", present, Ref{Namespace: "ns", Name: "other", SpecHash: "def", Legacy: "px-instance"}, ErrNotFound},
		{"missing, no earlier version's record", present, Ref{Namespace: "ns", Name: "other", SpecHash: "abc", Legacy: "px-gone"}, ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Reader{Client: tc.reader}.Lookup(ctx, tc.ref)
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, good, c)
				return
			}
			require.ErrorIs(t, err, tc.want)
			assert.False(t, errors.Is(err, ErrNotFound) && errors.Is(err, ErrUnavailable), "one kind or the other")
		})
	}
}

// TestRefFor: a Managed proxy's credentials are its spec's record in the
// operator's namespace (an earlier version's record of its instance as a
// fallback); an External proxy's are the Secret its spec names; a Managed
// proxy with no instance recorded has none yet.
func TestRefFor(t *testing.T) {
	managed := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1"},
		Spec:   crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local"},
		Status: crawlv1alpha1.ProxyStatus{InstanceName: "px-crawl-eu-1", SpecHash: "h1"}}
	ref, ok := RefFor(managed, "operator-ns")
	require.True(t, ok)
	assert.Equal(t, Ref{Namespace: "operator-ns", Name: "proxy-record-crawl-h1", SpecHash: "h1", Legacy: "px-crawl-eu-1"}, ref)

	starting := managed.DeepCopy()
	starting.Status = crawlv1alpha1.ProxyStatus{}
	_, ok = RefFor(starting, "operator-ns")
	assert.False(t, ok, "nothing recorded: no credentials to look up yet")

	external := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "ext"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, External: &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.1",
			Credentials: &crawlv1alpha1.CredentialsSource{SecretRef: crawlv1alpha1.LocalSecretReference{Name: "ext-creds"}}}}}
	ref, ok = RefFor(external, "operator-ns")
	require.True(t, ok)
	assert.Equal(t, Ref{Namespace: "crawl", Name: "ext-creds"}, ref)
}
