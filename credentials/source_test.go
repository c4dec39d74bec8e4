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
	present := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(secret).Build()
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
