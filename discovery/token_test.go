package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// watchToken starts a control plane and follows the discovery-token
// Secret of a namespace of its own, until the test ends.
func watchToken(t *testing.T) (*testenv.Env, string, context.Context, *SecretToken, cache.Cache) {
	t.Helper()
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	token, c, err := WatchTokenSecret(ctx, env.Config, env.Scheme, ns, "discovery-token")
	require.NoError(t, err)
	go func() { _ = c.Start(ctx) }()
	return env, ns, ctx, token, c
}

// TestTokenFollowsTheSecret: creating, rotating and deleting the Secret on a
// real API server changes the token at once; other Secrets are ignored.
func TestTokenFollowsTheSecret(t *testing.T) {
	env, ns, ctx, token, c := watchToken(t)
	require.True(t, c.WaitForCacheSync(ctx))

	current := func() string { tok, _ := token.Token(); return tok }
	tok, required := token.Token()
	assert.True(t, required, "no Secret: locked, never open")
	assert.Empty(t, tok)

	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
		Data: map[string][]byte{"token": []byte("not-this-one")}}))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "discovery-token"},
		Data: map[string][]byte{"token": []byte("first")}}
	require.NoError(t, env.Client.Create(ctx, secret))
	require.Eventually(t, func() bool { return current() == "first" }, 10*time.Second, 10*time.Millisecond)

	secret.Data["token"] = []byte("rotated")
	require.NoError(t, env.Client.Update(ctx, secret))
	require.Eventually(t, func() bool { return current() == "rotated" }, 10*time.Second, 10*time.Millisecond, "rotation needs no restart")

	// Whitespace around the value (a Secret made with echo) is not part of
	// the token.
	secret.Data["token"] = []byte("  padded\n")
	require.NoError(t, env.Client.Update(ctx, secret))
	require.Eventually(t, func() bool { return current() == "padded" }, 10*time.Second, 10*time.Millisecond)

	// Fails closed: a deleted Secret still requires a token, and none
	// matches until the Secret is back.
	require.NoError(t, env.Client.Delete(ctx, secret))
	require.Eventually(t, func() bool { tok, required := token.Token(); return required && tok == "" }, 10*time.Second, 10*time.Millisecond,
		"a deleted Secret must lock the API, not open it")
	secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "discovery-token"}, Data: map[string][]byte{"token": {}}}
	require.NoError(t, env.Client.Create(ctx, secret))
	time.Sleep(200 * time.Millisecond)
	tok, required = token.Token()
	assert.True(t, required, "a Secret without a token keeps the API locked")
	assert.Empty(t, tok)
	secret.Data["token"] = []byte("back")
	require.NoError(t, env.Client.Update(ctx, secret))
	require.Eventually(t, func() bool { return current() == "back" }, 10*time.Second, 10*time.Millisecond)
}

// TestTokenKeeperCreatesAMissingSecret: with auth required, a missing token
// Secret is created with a random token, and created anew (a new token: the
// rotation) when it is deleted; a Secret whose key was emptied is the
// user's, and stays locked until they fill it.
func TestTokenKeeperCreatesAMissingSecret(t *testing.T) {
	env, ns, ctx, token, c := watchToken(t)
	keeper := &TokenKeeper{Client: env.Client, Key: types.NamespacedName{Namespace: ns, Name: "discovery-token"}, Token: token, Synced: c.WaitForCacheSync}
	go func() { _ = keeper.Start(ctx) }()

	current := func() string { tok, _ := token.Token(); return tok }
	require.Eventually(t, func() bool { return len(current()) >= 40 }, 10*time.Second, 10*time.Millisecond, "a random token, generated")
	first := current()
	secret := &corev1.Secret{}
	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "discovery-token"}, secret))
	assert.Equal(t, first, string(secret.Data[TokenKey]), "the token is in the Secret, for the platform team to hand out")

	require.NoError(t, env.Client.Delete(ctx, secret))
	require.Eventually(t, func() bool { tok := current(); return tok != "" && tok != first }, 10*time.Second, 10*time.Millisecond,
		"a deleted Secret comes back with a new token: never open, and rotated")

	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "discovery-token"}, secret))
	secret.Data[TokenKey] = nil
	require.NoError(t, env.Client.Update(ctx, secret))
	require.Eventually(t, func() bool { return current() == "" }, 10*time.Second, 10*time.Millisecond)
	// The cache saw the emptied Secret (the marker above); the keeper acts
	// on a missing one only.
	require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "discovery-token"}, secret))
	assert.Empty(t, secret.Data[TokenKey], "an emptied key is not refilled behind the user's back")
	tok, required := token.Token()
	assert.True(t, required)
	assert.Empty(t, tok, "and the API stays locked")
}
