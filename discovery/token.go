package discovery

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// TokenKey is the key of the discovery token Secret that holds the token.
const TokenKey = "token"

// SecretToken is a TokenSource that follows the discovery token Secret
// through an informer: creating or rotating the Secret takes effect at once,
// without a restart. A token is always required: while the Secret is
// missing or its key empty, every request is refused (the API is locked),
// never served unauthenticated. Whether the API asks for a token at all is
// configuration (--discovery-auth), not something a Secret can change.
type SecretToken struct {
	token atomic.Pointer[string]
	// exists says the Secret is there, whatever its key holds.
	exists atomic.Bool
	// missing is signalled when the Secret is deleted, for TokenKeeper.
	missing chan struct{}
}

// NewSecretToken is a SecretToken with no Secret seen yet.
func NewSecretToken() *SecretToken { return &SecretToken{missing: make(chan struct{}, 1)} }

// Token implements TokenSource: required is always true, and token is
// empty while the Secret is missing or has none.
func (s *SecretToken) Token() (token string, required bool) {
	if t := s.token.Load(); t != nil {
		return *t, true
	}
	return "", true
}

// Set records the Secret's token, trimmed of surrounding whitespace (a
// Secret made with `echo` ends in a newline).
func (s *SecretToken) Set(secret *corev1.Secret) {
	s.exists.Store(true)
	if t := strings.TrimSpace(string(secret.Data[TokenKey])); t != "" {
		s.token.Store(&t)
		return
	}
	s.token.Store(nil)
}

// Handler is the informer event handler for the token Secret (the informer
// must watch that Secret only).
func (s *SecretToken) Handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if secret, ok := obj.(*corev1.Secret); ok {
				s.Set(secret)
			}
		},
		UpdateFunc: func(_, obj any) {
			if secret, ok := obj.(*corev1.Secret); ok {
				s.Set(secret)
			}
		},
		DeleteFunc: func(any) {
			s.token.Store(nil)
			s.exists.Store(false)
			select {
			case s.missing <- struct{}{}:
			default:
			}
		},
	}
}

// TokenKeeper makes sure the discovery token Secret exists: it creates it
// with a random token when it is missing at start, and again whenever it is
// deleted (deleting it is how the token is rotated, as with the proxies'
// generated credentials). A Secret that exists with an empty key is the
// user's: the API stays locked until they put a token in it. Every replica
// runs one; the first create wins and the others find it.
type TokenKeeper struct {
	Client client.Client
	Key    types.NamespacedName
	Token  *SecretToken
	// Synced waits for the token Secret's cache.
	Synced func(ctx context.Context) bool
}

// tokenKeeperRetry is how soon a failed create is tried again.
const tokenKeeperRetry = 10 * time.Second

// NeedLeaderElection is false: a replica that does not lead still serves
// discovery, and needs its token.
func (k *TokenKeeper) NeedLeaderElection() bool { return false }

// Start keeps the Secret until ctx ends.
func (k *TokenKeeper) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("discovery").WithValues("secret", k.Key.String())
	if !k.Synced(ctx) {
		return fmt.Errorf("the token Secret %s's cache did not sync", k.Key)
	}
	for {
		retry := time.Duration(0)
		if !k.Token.exists.Load() {
			if err := k.create(ctx); err != nil {
				log.Error(err, "the discovery API is locked until its token Secret exists; creating it failed")
				retry = tokenKeeperRetry
			}
		}
		var after <-chan time.Time
		if retry > 0 {
			after = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-k.Token.missing:
		case <-after:
		}
	}
}

// create makes the Secret with a new random token; one that exists already
// (another replica's, or the user's) is left as it is.
func (k *TokenKeeper) create(ctx context.Context) error {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("generating a token: %w", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.Key.Namespace, Name: k.Key.Name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "egress-proxies-operator"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{TokenKey: []byte(base64.RawURLEncoding.EncodeToString(raw))},
	}
	err := k.Client.Create(ctx, secret)
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil
	case err != nil:
		return fmt.Errorf("creating the discovery token Secret %s: %w", k.Key, err)
	}
	logf.FromContext(ctx).Info("generated the discovery token Secret", "secret", k.Key.String())
	return nil
}

// StaticToken is a fixed TokenSource; empty means unauthenticated
// (--discovery-auth=none).
type StaticToken string

// Token implements TokenSource.
func (t StaticToken) Token() (string, bool) {
	token := strings.TrimSpace(string(t))
	return token, token != ""
}

// WatchTokenSecret follows the Secret namespace/name through a cache of its
// own, which holds that one Secret and nothing else (the manager's cache
// holds only cloud-init Secrets). Add the cache to the manager and wait for
// its sync before serving.
func WatchTokenSecret(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, namespace, name string) (*SecretToken, cache.Cache, error) {
	c, err := cache.New(cfg, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Field: fields.OneTermEqualSelector("metadata.name", name)},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the cache for the token Secret %s/%s: %w", namespace, name, err)
	}
	informer, err := c.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		return nil, nil, fmt.Errorf("watching the token Secret %s/%s: %w", namespace, name, err)
	}
	token := NewSecretToken()
	if _, err := informer.AddEventHandler(token.Handler()); err != nil {
		return nil, nil, fmt.Errorf("watching the token Secret %s/%s: %w", namespace, name, err)
	}
	return token, c, nil
}
