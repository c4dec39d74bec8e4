package discovery

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TokenKey is the key of the discovery token Secret that holds the token.
const TokenKey = "token"

// SecretToken is a TokenSource that follows the discovery token Secret
// through an informer: creating or rotating the Secret takes effect at once,
// without a restart. It fails closed: once a token has been set, deleting the
// Secret or emptying its key refuses every request until a token is back,
// rather than opening the API to anyone.
type SecretToken struct {
	token   atomic.Pointer[string]
	everSet atomic.Bool
}

// Token implements TokenSource: required is true once a token has ever been
// set, and token is then empty while the Secret is missing.
func (s *SecretToken) Token() (token string, required bool) {
	if t := s.token.Load(); t != nil {
		return *t, true
	}
	return "", s.everSet.Load()
}

// Set records the Secret's token, trimmed of surrounding whitespace (a
// Secret made with `echo` ends in a newline).
func (s *SecretToken) Set(secret *corev1.Secret) {
	if t := strings.TrimSpace(string(secret.Data[TokenKey])); t != "" {
		s.token.Store(&t)
		s.everSet.Store(true)
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
		DeleteFunc: func(any) { s.token.Store(nil) },
	}
}

// StaticToken is a fixed TokenSource; empty means unauthenticated.
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
	token := &SecretToken{}
	if _, err := informer.AddEventHandler(token.Handler()); err != nil {
		return nil, nil, fmt.Errorf("watching the token Secret %s/%s: %w", namespace, name, err)
	}
	return token, c, nil
}
