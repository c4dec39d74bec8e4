// Package inspect holds the keys of the gateway's inspecting mode, which a
// crawler team opts into per tunnel (the username flag -inspect) and which
// is never the default: a CA per tenant that the team trusts, and the site
// certificates minted from it, so that the gateway can terminate the
// team's TLS, see each request and answer, pace each request exactly and
// record the site's refusals without the crawler reporting them.
//
// A tenant's CA is a Secret in the operator's namespace (SecretName): the
// operator creates one when it is missing, or uses the one a cert-manager
// Certificate (isCA: true) keeps there under that name. Its key never
// leaves the operator's namespace; a team reads its certificate only
// (GET /v1/inspect/ca). docs/inspecting.md has the threat model.
//
// It reads and writes Secrets and nothing else of the Kubernetes API; it
// must never import the gateway, discovery or the broker (depguard
// enforces it): they use it.
package inspect

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/tenant"
)

// Authority is each tenant's inspecting CA (Leaf set).
type Authority interface {
	CA(ctx context.Context, who *tenant.Tenant) (*tls.Certificate, error)
}

// Validity of what the operator makes.
const (
	// CAValidity is a CA's the operator creates; replace the Secret (or
	// let cert-manager renew it) before it ends.
	CAValidity = 365 * 24 * time.Hour
	// LeafValidity is a minted site certificate's; one is minted again
	// when it has less than LeafRenewBefore left.
	LeafValidity    = 24 * time.Hour
	LeafRenewBefore = time.Hour
	// caRereadAfter is how long a CA read from its Secret serves before
	// it is read again (a renewed one then takes over).
	caRereadAfter = 10 * time.Minute
	// maxLeaves bounds the minted certificates kept.
	maxLeaves = 4096
)

// SecretName is the name of who's CA Secret: a digest of the tenant's
// name, which may be longer than a Secret's name allows.
func SecretName(who *tenant.Tenant) string {
	sum := sha256.Sum256([]byte(who.Name))
	return "egress-inspect-ca-" + hex.EncodeToString(sum[:])[:16]
}

// TenantAnnotation on a CA Secret names its tenant.
const TenantAnnotation = "crawl.example.com/inspect-tenant"

// NewCA makes a self-signed CA, for a tenant's Secret or a test.
func NewCA(commonName string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a CA serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: commonName, Organization: []string{"egress-proxies-operator"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(CAValidity), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a CA certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a CA certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// CertificatePEM is ca's certificate as PEM, what a team adds to its
// crawler's trust store.
func CertificatePEM(ca *tls.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate[0]})
}

// Static is one CA for every tenant (a test's, a demo's).
type Static struct{ Cert *tls.Certificate }

// CA implements Authority.
func (s Static) CA(context.Context, *tenant.Tenant) (*tls.Certificate, error) { return s.Cert, nil }

// Secrets keeps each tenant's CA in a Secret of Namespace, creating it when
// missing; a CA read serves for a while, then is read again.
type Secrets struct {
	// Reader reads the Secrets (uncached: the manager caches no Secret of
	// this kind); Writer creates them.
	Reader    client.Reader
	Writer    client.Writer
	Namespace string
	Now       func() time.Time

	mu    sync.Mutex
	cache map[string]cachedCA
}

type cachedCA struct {
	cert *tls.Certificate
	at   time.Time
}

// CA implements Authority: who's CA from its Secret, created when missing.
func (s *Secrets) CA(ctx context.Context, who *tenant.Tenant) (*tls.Certificate, error) {
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	name := SecretName(who)
	s.mu.Lock()
	if c, ok := s.cache[name]; ok && now.Sub(c.at) < caRereadAfter {
		s.mu.Unlock()
		return c.cert, nil
	}
	s.mu.Unlock()
	cert, err := s.read(ctx, name)
	if apierrors.IsNotFound(err) {
		cert, err = s.create(ctx, who, name, now)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string]cachedCA{}
	}
	s.cache[name] = cachedCA{cert: cert, at: now}
	s.mu.Unlock()
	return cert, nil
}

func (s *Secrets) read(ctx context.Context, name string) (*tls.Certificate, error) {
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &sec); err != nil {
		return nil, err
	}
	return parseCA(&sec)
}

// create makes who's CA and its Secret; when another replica made it
// first, theirs is the one.
func (s *Secrets) create(ctx context.Context, who *tenant.Tenant, name string, now time.Time) (*tls.Certificate, error) {
	ca, err := NewCA("egress-proxies-operator inspecting CA for "+who.Name, now)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(ca.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return nil, fmt.Errorf("encoding the CA key: %w", err)
	}
	certPEM := CertificatePEM(&ca)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: name,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "egress-proxies-operator", "app.kubernetes.io/component": "inspect-ca"},
			Annotations: map[string]string{TenantAnnotation: who.Name}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
			"ca.crt": certPEM},
	}
	err = s.Writer.Create(ctx, sec)
	if apierrors.IsAlreadyExists(err) {
		return s.read(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("creating the inspecting CA Secret %s/%s of tenant %s: %w", s.Namespace, name, who.Name, err)
	}
	return &ca, nil
}

// parseCA reads a CA Secret: tls.crt and tls.key, the certificate a CA.
func parseCA(sec *corev1.Secret) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the inspecting CA Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	if !cert.Leaf.IsCA {
		return nil, fmt.Errorf("the inspecting CA Secret %s/%s holds no CA certificate (a cert-manager Certificate for it needs isCA: true)", sec.Namespace, sec.Name)
	}
	return &cert, nil
}

// Minter mints site certificates from tenants' CAs, and keeps them.
type Minter struct {
	once   sync.Once
	leaves *lru.Cache // "<CA serial>|<host>" -> *tls.Certificate
}

// ErrNoHost is a site certificate asked for no host.
var ErrNoHost = errors.New("a site certificate needs a host name or IP")

// Leaf is a certificate for host (a name or an IP) signed by ca, valid
// LeafValidity from now.
func (m *Minter) Leaf(ca *tls.Certificate, host string, now time.Time) (*tls.Certificate, error) {
	if host == "" {
		return nil, ErrNoHost
	}
	m.once.Do(func() { m.leaves = lru.New(maxLeaves) })
	key := ca.Leaf.SerialNumber.String() + "|" + host
	if v, ok := m.leaves.Get(key); ok {
		if c := v.(*tls.Certificate); c.Leaf.NotAfter.Sub(now) > LeafRenewBefore {
			return c, nil
		}
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("a key for %s: %w", host, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, fmt.Errorf("a serial for %s: %w", host, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: host},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(LeafValidity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, &priv.PublicKey, ca.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("a certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("a certificate for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.Certificate[0]}, PrivateKey: priv, Leaf: leaf}
	m.leaves.Add(key, c)
	return c, nil
}
