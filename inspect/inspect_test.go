package inspect

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/example/egress-proxies-operator/tenant"
)

var (
	teamA = &tenant.Tenant{Name: "system:serviceaccount:crawl-a:crawler"}
	teamB = &tenant.Tenant{Name: "system:serviceaccount:crawl-b:crawler"}
)

// TestEachTenantGetsACAOfItsOwnKeptInASecret: the first CA asked for a
// tenant is made and kept in its Secret; it is the same one afterwards,
// for another replica too; another tenant gets another.
func TestEachTenantGetsACAOfItsOwnKeptInASecret(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	replica1 := &Secrets{Reader: c, Writer: c, Namespace: "crawl-system"}
	replica2 := &Secrets{Reader: c, Writer: c, Namespace: "crawl-system"}

	a, err := replica1.CA(ctx, teamA)
	require.NoError(t, err)
	assert.True(t, a.Leaf.IsCA)
	var sec corev1.Secret
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "crawl-system", Name: SecretName(teamA)}, &sec))
	assert.Equal(t, corev1.SecretTypeTLS, sec.Type)
	assert.Equal(t, teamA.Name, sec.Annotations[TenantAnnotation])
	assert.Equal(t, "inspect-ca", sec.Labels["app.kubernetes.io/component"])

	again, err := replica2.CA(ctx, teamA)
	require.NoError(t, err)
	assert.Equal(t, a.Certificate[0], again.Certificate[0], "another replica reads the same CA")
	b, err := replica1.CA(ctx, teamB)
	require.NoError(t, err)
	assert.NotEqual(t, a.Certificate[0], b.Certificate[0], "each tenant its own")
	assert.NotEqual(t, SecretName(teamA), SecretName(teamB))
	assert.LessOrEqual(t, len(SecretName(teamA)), 63)
}

// TestABroughtCAIsUsedAndANonCAIsRefused: a Secret a cert-manager
// Certificate keeps under the name is used as it is; one whose
// certificate is no CA is refused with a reason.
func TestABroughtCAIsUsedAndANonCAIsRefused(t *testing.T) {
	ctx := context.Background()
	ca, err := NewCA("brought", time.Now())
	require.NoError(t, err)
	leaf, err := (&Minter{}).Leaf(&ca, "shop.example", time.Now())
	require.NoError(t, err)
	secret := func(name string, certDER []byte, key any) *corev1.Secret {
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl-system", Name: name}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{
				corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}),
				corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			}}
	}
	c := fake.NewClientBuilder().WithObjects(secret(SecretName(teamA), ca.Certificate[0], ca.PrivateKey),
		secret(SecretName(teamB), leaf.Certificate[0], leaf.PrivateKey)).Build()
	s := &Secrets{Reader: c, Writer: c, Namespace: "crawl-system"}
	got, err := s.CA(ctx, teamA)
	require.NoError(t, err)
	assert.Equal(t, ca.Certificate[0], got.Certificate[0])
	_, err = s.CA(ctx, teamB)
	require.ErrorContains(t, err, "isCA: true")
}

// TestMintedCertificatesChainToTheTenantsCA: a site certificate is for the
// host asked, verifies against the CA alone, and is kept until it nears
// its end.
func TestMintedCertificatesChainToTheTenantsCA(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("team", now)
	require.NoError(t, err)
	other, err := NewCA("other team", now)
	require.NoError(t, err)
	var m Minter
	for _, host := range []string{"shop.example", "127.0.0.81"} {
		leaf, err := m.Leaf(&ca, host, now)
		require.NoError(t, err)
		roots := x509.NewCertPool()
		roots.AddCert(ca.Leaf)
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, CurrentTime: now})
		require.NoError(t, err, host)
		otherRoots := x509.NewCertPool()
		otherRoots.AddCert(other.Leaf)
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: otherRoots, CurrentTime: now})
		require.Error(t, err, "another team's CA does not vouch for it")
		same, err := m.Leaf(&ca, host, now.Add(time.Hour))
		require.NoError(t, err)
		assert.Same(t, leaf, same, "kept")
		renewed, err := m.Leaf(&ca, host, now.Add(LeafValidity-LeafRenewBefore/2))
		require.NoError(t, err)
		assert.NotSame(t, leaf, renewed, "minted again near its end")
	}
	_, err = m.Leaf(&ca, "", now)
	require.ErrorIs(t, err, ErrNoHost)
}
