package kubeauth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const audienceForTest = "egress-proxies-operator"

// jwt is a token shaped like a ServiceAccount token (its signature is
// made up: only the fake API server below checks tokens).
func jwt(t testing.TB, alg string, claims map[string]any) string {
	t.Helper()
	h, err := json.Marshal(map[string]string{"alg": alg, "kid": "k1"})
	require.NoError(t, err)
	c, err := json.Marshal(claims)
	require.NoError(t, err)
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(c) + "." + enc([]byte("signature"))
}

// oneTokenServer knows one token; it counts every review.
type oneTokenServer struct {
	good  string
	calls atomic.Int32
	down  atomic.Bool
}

func (f *oneTokenServer) Create(_ context.Context, r *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, fmt.Errorf("the API server is away")
	}
	out := r.DeepCopy()
	if r.Spec.Token == f.good {
		out.Status.Authenticated = true
		out.Status.Audiences = r.Spec.Audiences
		out.Status.User = authenticationv1.UserInfo{Username: "system:serviceaccount:crawl-a:crawler"}
	}
	return out, nil
}

func TestPlausible(t *testing.T) {
	now := time.Now()
	exp := float64(now.Add(time.Hour).Unix())
	for _, tc := range []struct {
		name  string
		token string
		want  bool
	}{
		{"a ServiceAccount token for the audience", jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": exp}), true},
		{"aud as one string", jwt(t, "ES256", map[string]any{"aud": audienceForTest, "exp": exp}), true},
		{"another audience", jwt(t, "RS256", map[string]any{"aud": []string{"https://kubernetes.default.svc"}, "exp": exp}), false},
		{"expired", jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": float64(now.Add(-time.Second).Unix())}), false},
		{"no expiry", jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}}), false},
		{"alg none", jwt(t, "none", map[string]any{"aud": []string{audienceForTest}, "exp": exp}), false},
		{"a password", "hunter2", false},
		{"two dots", "a.b.c", false},
		{"no signature", jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": exp})[:10] + "..", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, plausible(tc.token, []string{audienceForTest}, now))
		})
	}
}

// Attack: strangers send the gateway random proxy passwords and forged
// tokens, hoping each costs the API server a TokenReview (five with
// retries) and evicts real tenants' answers. Random passwords cost none;
// forged tokens cost at most a client's burst plus its rate; a team's
// cached answer survives, even with the API server away.
func TestStrangersCannotDriveTokenReviews(t *testing.T) {
	ctx := context.Background()
	exp := float64(time.Now().Add(time.Hour).Unix())
	server := &oneTokenServer{good: jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": exp, "sub": "crawler"})}
	r := NewReviewer(server, &fakeAccess{}, audienceForTest, time.Minute)

	user, err := r.Authenticate(ctx, server.good, "10.0.0.1")
	require.NoError(t, err)
	require.NotNil(t, user)
	require.EqualValues(t, 1, server.calls.Load())

	start := time.Now()
	for range 10000 {
		b := make([]byte, 24)
		_, _ = rand.Read(b)
		user, err := r.Authenticate(ctx, base64.RawURLEncoding.EncodeToString(b), "192.0.2.7")
		require.NoError(t, err)
		require.Nil(t, user)
	}
	assert.EqualValues(t, 1, server.calls.Load(), "10,000 random passwords: no review")

	limited := 0
	for i := range 1000 {
		forged := jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": exp, "sub": fmt.Sprint(i)})
		user, err := r.Authenticate(ctx, forged, "192.0.2.7")
		if err != nil {
			require.ErrorIs(t, err, ErrTooManyReviews)
			limited++
			continue
		}
		require.Nil(t, user)
	}
	elapsed := time.Since(start).Seconds()
	reviews := int(server.calls.Load()) - 1
	bound := DefaultReviewBurst + int(DefaultReviewsPerSecond*elapsed) + 1
	assert.LessOrEqual(t, reviews, bound, "1,000 forged tokens from one address: at most its burst and rate (%.1fs)", elapsed)
	assert.Equal(t, 1000-reviews, limited, "the rest are told to retry")
	t.Logf("1,000 forged tokens from one address in %.2fs cost %d reviews (bound %d)", elapsed, reviews, bound)

	// Many addresses, each within its burst: every forged token is
	// reviewed once and refused, and the refusals evict no user.
	for i := range 2000 {
		forged := jwt(t, "RS256", map[string]any{"aud": []string{audienceForTest}, "exp": exp, "sub": fmt.Sprint("many-", i)})
		user, err := r.Authenticate(ctx, forged, fmt.Sprintf("198.51.100.%d", i%200))
		require.NoError(t, err)
		require.Nil(t, user)
	}
	server.down.Store(true)
	calls := server.calls.Load()
	user, err = r.Authenticate(ctx, server.good, "10.0.0.1")
	require.NoError(t, err, "the team's answer is still cached")
	require.NotNil(t, user)
	assert.Equal(t, calls, server.calls.Load(), "and asked nothing of the API server")
}
