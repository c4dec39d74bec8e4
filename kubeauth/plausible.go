package kubeauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/utils/lru"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

// A Reviewer answers strangers too: anyone can send the discovery API a
// bearer token or the gateway a proxy password. Three bounds keep them
// from driving the API server's TokenReviews and from evicting real
// tenants' answers: only what could be a ServiceAccount token for the
// audience is reviewed (plausible); each client address may have
// reviews made for it at a bounded rate (reviewLimits); and refusals are
// cached apart from the users found, so a flood of them evicts none.

// ErrTooManyReviews says the client's address had its share of
// TokenReviews lately; it may retry shortly (a known token never needs
// one: answers are cached).
var ErrTooManyReviews = errors.New("too many token reviews for this client address lately; retry shortly")

// Per client address: reviews per second, and the burst a new client gets
// (a crawler fleet's pods behind one NAT present their tokens at once).
const (
	DefaultReviewsPerSecond = 2
	DefaultReviewBurst      = 20
	// clientLimiters bounds the client addresses remembered.
	clientLimiters = 4096
)

// plausible says whether token could be a ServiceAccount token issued for
// one of audiences and not yet expired at now: a JWT (three base64url
// parts) whose header names an algorithm and whose claims hold such an
// audience and a future expiry. Its signature is the API server's to
// check; this only spares the API server what cannot pass.
func plausible(token string, audiences []string, now time.Time) bool {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return false
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if !decodePart(parts[0], &header) || header.Alg == "" || strings.EqualFold(header.Alg, "none") {
		return false
	}
	var claims struct {
		Aud audience `json:"aud"`
		Exp *float64 `json:"exp"`
	}
	if !decodePart(parts[1], &claims) || claims.Exp == nil || !now.Before(time.Unix(int64(*claims.Exp), 0)) {
		return false
	}
	if len(audiences) == 0 {
		return true
	}
	return slices.ContainsFunc(claims.Aud, func(a string) bool { return slices.Contains(audiences, a) })
}

func decodePart(part string, v any) bool {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(part, "="))
	return err == nil && json.Unmarshal(raw, v) == nil
}

// audience is a JWT's aud claim: one string or a list (RFC 7519 4.1.3).
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// reviewLimits rate-limits the reviews made for each client address.
type reviewLimits struct {
	perSecond rate.Limit
	burst     int
	byClient  *lru.Cache
}

func newReviewLimits(perSecond float64, burst int) *reviewLimits {
	return &reviewLimits{perSecond: rate.Limit(perSecond), burst: burst, byClient: lru.New(clientLimiters)}
}

// allow takes one review from client's share ("" shares one bucket: a
// caller that cannot say who asks).
func (l *reviewLimits) allow(client string) bool {
	if v, ok := l.byClient.Get(client); ok {
		return v.(*rate.Limiter).Allow()
	}
	lim := rate.NewLimiter(l.perSecond, l.burst)
	l.byClient.Add(client, lim)
	return lim.Allow()
}

// tokenReviewsSpared counts the TokenReviews not made for strangers.
var tokenReviewsSpared = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Subsystem: "tenant", Name: "token_reviews_spared_total",
	Help: "Bearer tokens and proxy passwords answered without a TokenReview, by reason: implausible (no JWT for the operator's audience, or expired), rate_limited (the client address had its share of reviews lately).",
}, []string{"reason"})

func init() {
	ctrlmetrics.Registry.MustRegister(tokenReviewsSpared)
}
