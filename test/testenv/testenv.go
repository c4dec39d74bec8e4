// Package testenv starts a real kube-apiserver and etcd (built from source by
// `make envtest`) with the operator's CRDs installed, for tests that must see
// what a cluster really does: validation, defaulting, status subresources,
// watches. It is test support only; production code must never import it.
package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// Env is a running control plane and a client for it.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is an uncached client with the operator's scheme.
	Client client.Client
	// Scheme knows the built-in types, CRDs and the Proxy API.
	Scheme *k8sruntime.Scheme

	env *envtest.Environment
}

// RepoRoot is the repository's root directory, found from this file's path so
// tests in any package can locate config/.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start starts a control plane for one test (and its subtests) and stops it
// when the test ends. It fails the test, naming the command that fixes it,
// when the control-plane binaries are missing.
func Start(t testing.TB) *Env {
	t.Helper()
	env, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	return env
}

// New starts a control plane; the caller must Stop it. TestMain functions use
// it where one control plane serves a whole package.
func New() (*Env, error) {
	if err := checkAssets(os.Getenv("KUBEBUILDER_ASSETS")); err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane from KUBEBUILDER_ASSETS=%s: %w", os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, env: env}, nil
}

// NewScheme knows the built-in types, CRDs and the Proxy API.
func NewScheme() (*k8sruntime.Scheme, error) {
	scheme := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, crawlv1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// checkAssets fails with instructions when the control-plane binaries are not
// where envtest will look for them.
func checkAssets(dir string) error {
	const howTo = "run the tests with `make test`, which builds kube-apiserver, etcd and kubectl from source (`make envtest`) and sets KUBEBUILDER_ASSETS"
	if dir == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is not set: %s", howTo)
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return fmt.Errorf("KUBEBUILDER_ASSETS=%s has no %s: %s: %w", dir, bin, howTo, err)
		}
	}
	return nil
}

var shared struct {
	once sync.Once
	env  *Env
	err  error
}

// Shared returns one control plane for the whole test binary, started on
// first use. The package's TestMain must call StopShared after m.Run.
func Shared(t testing.TB) *Env {
	t.Helper()
	shared.once.Do(func() { shared.env, shared.err = New() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env
}

// StopShared stops the control plane Shared started, if it did.
func StopShared() {
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		}
	}
}

// Namespace creates a namespace with a unique name for one test, so tests
// sharing a control plane do not see each other's objects.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// Kubeconfig writes a kubeconfig for an administrator of this control plane
// into the test's temporary directory and returns its path, for processes
// (the operator binary, kubectl) that read one.
func (e *Env) Kubeconfig(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := e.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// WriteKubeconfig writes a kubeconfig for an administrator of this control
// plane to path.
func (e *Env) WriteKubeconfig(path string) error {
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding an admin user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("rendering a kubeconfig: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return nil
}

// MintServiceAccountToken signs a token for sa, for audience, expiring at
// exp, with the API server's own ServiceAccount key (ES256): what
// TokenRequest issues, but with an expiry TokenRequest would not allow (an
// expired one, for tests of refusal).
func (e *Env) MintServiceAccountToken(t testing.TB, sa *corev1.ServiceAccount, audience string, exp time.Time) string {
	t.Helper()
	s := e.env.ControlPlane.APIServer
	keyFile, issuer := filepath.Join(s.CertDir, "sa-signer.key"), s.SecureServing.URL("https", "/").String()
	raw, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		t.Fatalf("no PEM key in %s", keyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		parsed, err = x509.ParseECPrivateKey(block.Bytes)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if err != nil || !ok {
		t.Fatalf("envtest's ServiceAccount key is not ECDSA (%T): %v", parsed, err)
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	iat := exp.Add(-2 * time.Hour)
	claims := map[string]any{
		"iss": issuer, "sub": "system:serviceaccount:" + sa.Namespace + ":" + sa.Name, "aud": []string{audience},
		"exp": exp.Unix(), "iat": iat.Unix(), "nbf": iat.Unix(),
		"kubernetes.io": map[string]any{"namespace": sa.Namespace, "serviceaccount": map[string]any{"name": sa.Name, "uid": string(sa.UID)}},
	}
	signing := enc(map[string]string{"alg": "ES256", "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signing))
	r, sv, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64) // JWS ES256: r and s, 32 bytes each
	r.FillBytes(sig[:32])
	sv.FillBytes(sig[32:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}
