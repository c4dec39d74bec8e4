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

	require.NoError(t, env.Client.Delete(ctx, secret))
	require.Eventually(t, func() bool { _, ok := token.Token(); return !ok }, 10*time.Second, 10*time.Millisecond)
}
