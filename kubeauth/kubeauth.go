// Package kubeauth asks the API server who holds a bearer token
// (TokenReview) and what they may do (SubjectAccessReview), both cached and
// retried as k8s.io/apiserver's delegating authenticator and authorizer do.
// Filter guards the operator's metrics endpoint the way kubebuilder's
// secure metrics do (a SubjectAccessReview on the request's path and verb);
// Reviewer checks crawler teams' ServiceAccount tokens, for an audience of
// the operator's, and their access to the virtual resources the tenant
// package names.
//
// Filter replaces controller-runtime's filters.WithAuthenticationAndAuthorization,
// which does the same two reviews through k8s.io/apiserver's delegating
// authenticator and authorizer. Those link k8s.io/apiserver and, through its
// webhook authorizer, cel-go: 8 MB of the operator's binary and some 12 MiB
// of every replica's resident memory (docs/performance.md), for two typed
// API calls. This package makes them with client-go alone, and must never
// import k8s.io/apiserver (depguard enforces it). It knows nothing of
// Proxies.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// How long answers are reused: the values controller-runtime's filter gives
// k8s.io/apiserver's delegating authenticator and authorizer, so a scrape
// every 15 s costs the API server about one review a minute.
const (
	tokenTTL   = time.Minute
	allowTTL   = 5 * time.Minute
	denyTTL    = 30 * time.Second
	reviewWait = 10 * time.Second
	cacheSize  = 1024
)

// retryBackoff is how a review the API server could not answer is retried:
// the delegating authenticator's and authorizer's (k8s.io/apiserver's
// DefaultAuthWebhookRetryBackoff), about 5 s in all.
var retryBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// TokenReviewer checks a bearer token: the API server's TokenReview.
type TokenReviewer interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// AccessReviewer asks whether a user may do something: the API server's
// SubjectAccessReview.
type AccessReviewer interface {
	Create(ctx context.Context, review *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// WithAuthenticationAndAuthorization is a metricsserver.Options
// FilterProvider: it builds the two review clients from the manager's
// config and HTTP client. The operator's ServiceAccount needs create on
// tokenreviews and subjectaccessreviews; a scraper needs get on the
// nonResourceURL /metrics (the chart's metrics-reader ClusterRole).
func WithAuthenticationAndAuthorization(config *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	tokens, access, err := reviewClients(config, httpClient)
	if err != nil {
		return nil, err
	}
	return NewFilter(tokens, access), nil
}

// reviewClients are the API server's TokenReview and SubjectAccessReview
// clients over config and httpClient.
func reviewClients(config *rest.Config, httpClient *http.Client) (TokenReviewer, AccessReviewer, error) {
	authn, err := authenticationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("building the TokenReview client: %w", err)
	}
	authz, err := authorizationclient.NewForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("building the SubjectAccessReview client: %w", err)
	}
	return authn.TokenReviews(), authz.SubjectAccessReviews(), nil
}

// NewFilter is the filter over the given reviewers, with its own caches.
func NewFilter(tokens TokenReviewer, access AccessReviewer) metricsserver.Filter {
	g := newGuard(tokens, access)
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			g.serve(log, next, w, req)
		}), nil
	}
}

// guard holds the reviewers and what they answered lately. Its caches are
// keyed by hashes: a token is never kept.
type guard struct {
	tokens TokenReviewer
	access AccessReviewer
	// audiences, when set, are what a token must be issued for.
	audiences []string
	// How long answers are reused.
	tokenTTL, allowTTL, denyTTL time.Duration
	users                       *cache.LRUExpireCache // sha256(token) → user (*authenticationv1.UserInfo, nil when refused)
	decisions                   *cache.LRUExpireCache // sha256(user, attributes) → bool
	// refused, when set, holds the tokens refused apart from users, so
	// strangers' tokens never evict a known user's; limits, when set,
	// bounds the reviews per client address; strangers' tokens that are
	// no plausible ServiceAccount token are then never reviewed.
	refused *cache.LRUExpireCache
	limits  *reviewLimits
	now     func() time.Time
}

func newGuard(tokens TokenReviewer, access AccessReviewer) *guard {
	return &guard{tokens: tokens, access: access, tokenTTL: tokenTTL, allowTTL: allowTTL, denyTTL: denyTTL,
		users: cache.NewLRUExpireCache(cacheSize), decisions: cache.NewLRUExpireCache(cacheSize)}
}

// Reviewer checks bearer tokens issued for one audience and what their
// users may do on resources. Each answer is reused for its TTL, so a
// revoked RoleBinding or a deleted ServiceAccount stops access within it,
// and a new binding starts it within it.
type Reviewer struct{ g *guard }

// DefaultReviewTTL is how long a Reviewer reuses an answer.
const DefaultReviewTTL = time.Minute

// NewReviewer is a Reviewer for tokens whose audiences include audience,
// reusing answers for ttl (0: DefaultReviewTTL).
func NewReviewer(tokens TokenReviewer, access AccessReviewer, audience string, ttl time.Duration) *Reviewer {
	if ttl <= 0 {
		ttl = DefaultReviewTTL
	}
	g := newGuard(tokens, access)
	g.audiences = []string{audience}
	g.tokenTTL, g.allowTTL, g.denyTTL = ttl, ttl, ttl
	g.refused, g.limits, g.now = cache.NewLRUExpireCache(cacheSize), newReviewLimits(DefaultReviewsPerSecond, DefaultReviewBurst), time.Now
	return &Reviewer{g: g}
}

// NewReviewerFor builds a Reviewer's two clients from a config and an HTTP
// client.
func NewReviewerFor(config *rest.Config, httpClient *http.Client, audience string, ttl time.Duration) (*Reviewer, error) {
	tokens, access, err := reviewClients(config, httpClient)
	if err != nil {
		return nil, err
	}
	return NewReviewer(tokens, access, audience, ttl), nil
}

// Authenticate is the user token belongs to, nil when the API server does
// not know it or it was not issued for the audience (expired, revoked, its
// ServiceAccount deleted); err when the API server could not say, or
// (ErrTooManyReviews) when client, the address that presented it, had its
// share of reviews lately. A token that is no plausible ServiceAccount
// token for the audience is nil without a review.
func (r *Reviewer) Authenticate(ctx context.Context, token, client string) (*authenticationv1.UserInfo, error) {
	g := r.g
	key := digest(token)
	if cached, ok := g.users.Get(key); ok {
		return cached.(*authenticationv1.UserInfo), nil
	}
	if _, ok := g.refused.Get(key); ok {
		return nil, nil
	}
	if !plausible(token, g.audiences, g.now()) {
		tokenReviewsSpared.WithLabelValues("implausible").Inc()
		return nil, nil
	}
	if !g.limits.allow(client) {
		tokenReviewsSpared.WithLabelValues("rate_limited").Inc()
		return nil, ErrTooManyReviews
	}
	return g.authenticate(ctx, token)
}

// Allowed says whether user may do what attrs describe.
func (r *Reviewer) Allowed(ctx context.Context, user *authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	allowed, _, err := r.g.decide(ctx, user, authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: &attrs})
	return allowed, err
}

func (g *guard) serve(log logr.Logger, next http.Handler, w http.ResponseWriter, req *http.Request) {
	token, ok := bearerToken(req)
	if !ok {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	user, err := g.authenticate(req.Context(), token)
	if err != nil {
		log.Error(err, "Authentication failed")
		http.Error(w, "Authentication failed", http.StatusInternalServerError)
		return
	}
	if user == nil {
		log.V(4).Info("Authentication failed")
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	verb, path := strings.ToLower(req.Method), req.URL.Path
	allowed, reason, err := g.authorize(req.Context(), user, verb, path)
	if err != nil {
		msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
		log.Error(err, msg)
		http.Error(w, msg, http.StatusInternalServerError)
		return
	}
	if !allowed {
		msg := fmt.Sprintf("Authorization denied for user %s", user.Username)
		log.V(4).Info(msg, "reason", reason)
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	req.Header.Del("Authorization") // as the apiserver's bearer token authenticator does: the handler has no use for it
	next.ServeHTTP(w, req)
}

// bearerToken is the request's bearer token, read as k8s.io/apiserver's
// bearertoken authenticator reads it: the scheme is case-insensitive, an
// empty token is none.
func bearerToken(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(req.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticate is the user a token belongs to, nil if the API server does
// not know it; err when it could not say.
func (g *guard) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	key := digest(token)
	if cached, ok := g.users.Get(key); ok {
		return cached.(*authenticationv1.UserInfo), nil
	}
	var answer *authenticationv1.TokenReview
	err := review(ctx, func(ctx context.Context) (err error) {
		answer, err = g.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: g.audiences}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reviewing a bearer token: %w", err)
	}
	var user *authenticationv1.UserInfo
	if answer.Status.Authenticated && audiencesMatch(g.audiences, answer.Status.Audiences) {
		user = &answer.Status.User
	}
	if user == nil && g.refused != nil {
		g.refused.Add(key, true, g.tokenTTL)
		return nil, nil
	}
	g.users.Add(key, user, g.tokenTTL)
	return user, nil
}

// audiencesMatch says whether a token reviewed for want was issued for one
// of them: the API server answers with the intersection, and an
// authenticator that ignores audiences answers none (then any will do only
// when none was wanted).
func audiencesMatch(want, got []string) bool {
	if len(want) == 0 {
		return true
	}
	for _, a := range got {
		if slices.Contains(want, a) {
			return true
		}
	}
	return false
}

// authorize says whether user may verb path, with the API server's reason.
func (g *guard) authorize(ctx context.Context, user *authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	return g.decide(ctx, user, authorizationv1.SubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	})
}

// decide asks whether user may do what spec's attributes describe.
func (g *guard) decide(ctx context.Context, user *authenticationv1.UserInfo, spec authorizationv1.SubjectAccessReviewSpec) (bool, string, error) {
	spec.User, spec.UID, spec.Groups, spec.Extra = user.Username, user.UID, user.Groups, extraOf(user.Extra)
	sar := &authorizationv1.SubjectAccessReview{Spec: spec}
	key := decisionKey(sar.Spec)
	if cached, ok := g.decisions.Get(key); ok {
		return cached.(bool), "cached", nil
	}
	var answer *authorizationv1.SubjectAccessReview
	err := review(ctx, func(ctx context.Context) (err error) {
		answer, err = g.access.Create(ctx, sar, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, "", fmt.Errorf("reviewing %s's access to %s: %w", user.Username, describe(spec), err)
	}
	allowed := answer.Status.Allowed && !answer.Status.Denied
	ttl := g.denyTTL
	if allowed {
		ttl = g.allowTTL
	}
	g.decisions.Add(key, allowed, ttl)
	return allowed, answer.Status.Reason, nil
}

// review makes one review call, each attempt bounded by reviewWait,
// retrying with retryBackoff while the API server cannot answer; a request
// it refuses as such (bad request, forbidden) is not retried.
func review(ctx context.Context, call func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, retryBackoff, func(ctx context.Context) (bool, error) {
		attempt, cancel := context.WithTimeout(ctx, reviewWait)
		defer cancel()
		last = call(attempt)
		if last == nil {
			return true, nil
		}
		return false, permanent(last)
	})
	if last != nil {
		return last
	}
	return err
}

// permanent is err when retrying cannot help: the API server refused the
// request itself, rather than failing to answer it.
func permanent(err error) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if code := status.Status().Code; code >= 400 && code < 500 && code != http.StatusTooManyRequests {
			return err
		}
	}
	return nil
}

func extraOf(in map[string]authenticationv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]authorizationv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}

// decisionKey names one question asked of the API server: who (name, uid,
// groups, extra), which verb, which path.
func decisionKey(spec authorizationv1.SubjectAccessReviewSpec) string {
	var b strings.Builder
	field := func(s string) { fmt.Fprintf(&b, "%d:%s", len(s), s) }
	field(spec.User)
	field(spec.UID)
	for _, g := range spec.Groups {
		field(g)
	}
	b.WriteString("|")
	keys := make([]string, 0, len(spec.Extra))
	for k := range spec.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		for _, v := range spec.Extra[k] {
			field(v)
		}
		b.WriteString(";")
	}
	b.WriteString("|")
	field(describe(spec))
	return digest(b.String())
}

// describe names what a review asks about: "get /metrics", or "create
// crawl.example.com/proxypools/lease eu in crawl".
func describe(spec authorizationv1.SubjectAccessReviewSpec) string {
	if n := spec.NonResourceAttributes; n != nil {
		return n.Verb + " " + n.Path
	}
	r := spec.ResourceAttributes
	if r == nil {
		return ""
	}
	what := r.Verb + " " + r.Group + "/" + r.Resource
	if r.Subresource != "" {
		what += "/" + r.Subresource
	}
	if r.Name != "" {
		what += " " + r.Name
	}
	if r.Namespace != "" {
		what += " in " + r.Namespace
	}
	return what
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
