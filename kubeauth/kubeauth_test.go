package kubeauth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fakeTokens knows one token, for user "scraper"; fail makes its next
// answers errors.
type fakeTokens struct {
	calls atomic.Int32
	fail  []error
}

func (f *fakeTokens) Create(_ context.Context, r *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	n := int(f.calls.Add(1))
	if n <= len(f.fail) {
		return nil, f.fail[n-1]
	}
	out := r.DeepCopy()
	if r.Spec.Token == "good-token" || r.Spec.Token == "reader-token" {
		out.Status.Authenticated = true
		out.Status.User = authenticationv1.UserInfo{Username: strings.TrimSuffix(r.Spec.Token, "-token"), UID: "uid-1", Groups: []string{"system:authenticated"}}
	}
	return out, nil
}

// fakeAccess allows user "reader" to get /metrics, nothing else.
type fakeAccess struct {
	calls atomic.Int32
	seen  []authorizationv1.SubjectAccessReviewSpec
}

func (f *fakeAccess) Create(_ context.Context, r *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.calls.Add(1)
	f.seen = append(f.seen, r.Spec)
	out := r.DeepCopy()
	na := r.Spec.NonResourceAttributes
	out.Status.Allowed = r.Spec.User == "reader" && na != nil && na.Path == "/metrics" && na.Verb == "get"
	if !out.Status.Allowed {
		out.Status.Reason = "no RBAC policy matched"
	}
	return out, nil
}

// serve sends one request through a filter over the fakes and returns the
// status and whether the guarded handler ran (and saw no Authorization).
func serve(t *testing.T, h http.Handler, method, path, authorization string) (int, bool) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("X-Served") == "yes"
}

func guarded(t *testing.T, tokens TokenReviewer, access AccessReviewer) http.Handler {
	t.Helper()
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.Empty(t, r.Header.Get("Authorization"), "the token reaches no further than the filter")
		w.Header().Set("X-Served", "yes")
	})
	h, err := NewFilter(tokens, access)(logr.Discard(), next)
	require.NoError(t, err)
	return h
}

func TestFilterAnswersLikeKubebuilderSecureMetrics(t *testing.T) {
	tokens, access := &fakeTokens{}, &fakeAccess{}
	h := guarded(t, tokens, access)

	for _, tc := range []struct {
		name, method, path, authorization string
		want                              int
	}{
		{"no token", http.MethodGet, "/metrics", "", http.StatusUnauthorized},
		{"not a bearer token", http.MethodGet, "/metrics", "Basic cmVhZGVyOng=", http.StatusUnauthorized},
		{"an empty bearer token", http.MethodGet, "/metrics", "Bearer ", http.StatusUnauthorized},
		{"a token nobody knows", http.MethodGet, "/metrics", "Bearer stolen", http.StatusUnauthorized},
		{"a known user without the role", http.MethodGet, "/metrics", "Bearer good-token", http.StatusForbidden},
		{"the reader", http.MethodGet, "/metrics", "Bearer reader-token", http.StatusOK},
		{"the scheme in any case", http.MethodGet, "/metrics", "bearer reader-token", http.StatusOK},
		{"the reader on another path", http.MethodGet, "/debug", "Bearer reader-token", http.StatusForbidden},
		{"the reader with another verb", http.MethodPost, "/metrics", "Bearer reader-token", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, served := serve(t, h, tc.method, tc.path, tc.authorization)
			assert.Equal(t, tc.want, code)
			assert.Equal(t, tc.want == http.StatusOK, served, "the handler runs only for an allowed request")
		})
	}
	require.NotEmpty(t, access.seen)
	last := access.seen[len(access.seen)-1]
	assert.Equal(t, &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "post"}, last.NonResourceAttributes,
		"the question is the request's path and its lower-case method")
	assert.Equal(t, []string{"system:authenticated"}, last.Groups)
	assert.Equal(t, "uid-1", last.UID)
}

func TestFilterCachesAnswersAndNeverTheToken(t *testing.T) {
	tokens, access := &fakeTokens{}, &fakeAccess{}
	h := guarded(t, tokens, access)
	for range 5 {
		code, _ := serve(t, h, http.MethodGet, "/metrics", "Bearer reader-token")
		require.Equal(t, http.StatusOK, code)
		code, _ = serve(t, h, http.MethodGet, "/metrics", "Bearer stolen")
		require.Equal(t, http.StatusUnauthorized, code)
		code, _ = serve(t, h, http.MethodGet, "/metrics", "Bearer good-token")
		require.Equal(t, http.StatusForbidden, code)
	}
	assert.EqualValues(t, 3, tokens.calls.Load(), "one TokenReview per token, refusals included")
	assert.EqualValues(t, 2, access.calls.Load(), "one SubjectAccessReview per user and question, denials included")

	g := newGuard(tokens, access)
	_, _ = g.authenticate(context.Background(), "reader-token")
	for _, k := range g.users.Keys() {
		assert.NotContains(t, k, "reader-token", "the cache is keyed by the token's hash")
	}
}

func TestFilterRetriesAnAPIServerThatCannotAnswer(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("etcd is slow")
	tokens, access := &fakeTokens{fail: []error{unavailable, errors.New("connection reset")}}, &fakeAccess{}
	code, served := serve(t, guarded(t, tokens, access), http.MethodGet, "/metrics", "Bearer reader-token")
	assert.Equal(t, http.StatusOK, code, "two failures, then an answer")
	assert.True(t, served)
	assert.EqualValues(t, 3, tokens.calls.Load())
}

func TestFilterDoesNotRetryARefusedReview(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("the operator may not review tokens"))
	tokens := &fakeTokens{fail: []error{forbidden}}
	h := guarded(t, tokens, &fakeAccess{})
	code, served := serve(t, h, http.MethodGet, "/metrics", "Bearer reader-token")
	assert.Equal(t, http.StatusInternalServerError, code, "the operator's own RBAC is wrong: an error, not a refusal of the scraper")
	assert.False(t, served)
	assert.EqualValues(t, 1, tokens.calls.Load(), "a refusal is not retried")

	// An error is not cached: once the RBAC is mended, the next scrape passes.
	code, _ = serve(t, h, http.MethodGet, "/metrics", "Bearer reader-token")
	assert.Equal(t, http.StatusOK, code)
}
