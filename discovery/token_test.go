package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestTokenFollowsTheSecret: creating, rotating and deleting the Secret on a
// real API server changes the token at once; other Secrets are ignored.
func TestTokenFollowsTheSecret(t *testing.T) {
	env := testenv.Start(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	token, c, err := WatchTokenSecret(ctx, env.Config, env.Scheme, ns, "discovery-token")
	require.NoError(t, err)
	go func() { _ = c.Start(ctx) }()
	require.True(t, c.WaitForCacheSync(ctx))

	current := func() string { tok, _ := token.Token(); return tok }
	_, ok := token.Token()
	assert.False(t, ok, "no Secret: no token")

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

	// Fails closed: once a token was set, a deleted Secret still requires
	// one, and none matches until the Secret is back.
	require.NoError(t, env.Client.Delete(ctx, secret))
	require.Eventually(t, func() bool { tok, required := token.Token(); return required && tok == "" }, 10*time.Second, 10*time.Millisecond,
		"a deleted Secret must lock the API, not open it")
	secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "discovery-token"}, Data: map[string][]byte{"token": {}}}
	require.NoError(t, env.Client.Create(ctx, secret))
	time.Sleep(200 * time.Millisecond)
	tok, required := token.Token()
	assert.True(t, required, "a Secret without a token keeps the API locked")
	assert.Empty(t, tok)
	secret.Data["token"] = []byte("back")
	require.NoError(t, env.Client.Update(ctx, secret))
	require.Eventually(t, func() bool { return current() == "back" }, 10*time.Second, 10*time.Millisecond)
}
