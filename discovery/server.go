package discovery

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// Defaults for the discovery flags.
const (
	DefaultTTL      = 300 * time.Second
	DefaultMaxTTL   = time.Hour
	DefaultCooldown = 15 * time.Minute
	// MaxReportRetryAfter bounds a client's retryAfterSeconds.
	MaxReportRetryAfter = 24 * time.Hour
	// retryAfterNoProxyBase is the Retry-After for a 503 when no cooldown
	// end tells a better one (no proxy matches at all).
	retryAfterNoProxyBase = 5 * time.Second
	// MaxBodyBytes bounds request bodies: the largest valid one is a few
	// hundred bytes.
	MaxBodyBytes = 16 << 10
)

// Error codes, stable for clients to switch on.
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidRequest   = "invalid_request"
	CodeBodyTooLarge     = "body_too_large"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"
	CodeLeaseNotFound    = "lease_not_found"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeNoProxyAvailable = "no_proxy_available"
	CodeNotReady         = "not_ready"
	// CodeProxyUnavailable: the lease's proxy is no longer healthy or no
	// longer exists; lease another.
	CodeProxyUnavailable = "proxy_unavailable"
	// CodeStoreUnavailable: the lease store (Redis) did not answer within
	// its timeout; retry after Retry-After. Nothing was leased, renewed,
	// released or reported unless the response says so.
	CodeStoreUnavailable = "store_unavailable"
	// CodeSessionNotFound: no gateway session of that name has tunnelled
	// lately.
	CodeSessionNotFound = "session_not_found"
	// CodeQuotaExceeded: the tenant is at one of its TenantQuota's limits;
	// retry after Retry-After.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeAuthUnavailable: the API server could not say who the client is
	// or what it may lease; retry after Retry-After.
	CodeAuthUnavailable = "auth_unavailable"
	// CodeTargetPaced: the target's politeness (a CrawlTarget, or the pace
	// its push-backs taught) allows no candidate a request within the
	// lease's maxWaitSeconds; retry after Retry-After.
	CodeTargetPaced = "target_paced"
)

// retryAfterStoreUnavailable is the Retry-After of a store_unavailable
// answer: long enough not to hammer a Redis that is coming back.
const retryAfterStoreUnavailable = 2 * time.Second

// TokenSource supplies the bearer token. required false means the API was
// configured to serve unauthenticated (--discovery-auth=none), and then
// never hands out proxy credentials; required with an empty token means the
// token is missing, and every request is refused until it is there.
type TokenSource interface {
	Token() (token string, required bool)
}

// Auth states, as the proxy_operator_discovery_auth_enabled metric does not
// tell them apart: open (--discovery-auth=none), enforced, locked (the
// token Secret is missing or empty).
const (
	authUnknown int32 = iota - 1
	authOpen
	authEnforced
	authLocked
)

// Options configure a Server.
type Options struct {
	// Addr is the listen address; "0" disables the server.
	Addr string
	// DefaultTTL, MaxTTL bound lease lifetimes; DefaultCooldown is the
	// rate_limited cooldown when the client asks for less.
	DefaultTTL, MaxTTL, DefaultCooldown time.Duration
	// Store keeps leases; View lists proxies; Tokens authenticates.
	Store Store
	// StoreTimeout bounds each store call (DefaultStoreTimeout when 0).
	StoreTimeout time.Duration
	View         *View
	Tokens       TokenSource
	// Ready says whether the view is fed (the cache synced); /readyz also
	// asks the store.
	Ready func() bool
	// WaitForTokens blocks until the token source knows whether a token
	// exists; until then the API does not listen, so it never serves
	// unauthenticated by mistake at startup. Nil: nothing to wait for.
	WaitForTokens func(ctx context.Context) bool
	// Clock times requests for the metrics (leases are on the store's clock).
	Clock clock.WithTicker
	// Credentials reads proxies' credentials, which leases and listings
	// carry when the API is authenticated. Nil: shown without them.
	Credentials CredentialsLookup
	// Politeness paces the hosts leases and tunnels target.
	Politeness Politeness
	// Tenants, when set, accepts bearer tokens other than the discovery
	// token (ServiceAccount tokens) and narrows each such tenant to the
	// proxies RBAC lets it lease. Nil: the discovery token only.
	Tenants Tenants
	// Quotas bounds each tenant's share (TenantQuotas). Nil: no limits.
	Quotas Quotas
	// Ledger receives every ledger record (the JSON-lines log); the store
	// keeps them for LedgerRetention (DefaultLedgerRetention when 0).
	Ledger          LedgerSink
	LedgerRetention time.Duration
}

// CredentialsLookup reads a proxy's credentials (credentials.Reader over
// the operator's cache of credentials Secrets).
type CredentialsLookup interface {
	Lookup(ctx context.Context, ref credentials.Ref) (credentials.Credentials, error)
}

// Why a proxy is shown without its credentials.
const (
	withheldUnauthenticated = "the discovery API runs unauthenticated (--discovery-auth=none), so it never hands out proxy credentials: run it with --discovery-auth=required (the default; see docs/security.md) and send Authorization: Bearer <token>"
	withheldUnavailable     = "the proxy's credentials cannot be read right now; lease another or retry"
	withheldPerLease        = "this proxy takes credentials of a lease's own: lease it (POST /v1/leases) and use the lease's"
)

// withCredentials fills in a proxy's credentials for lease (nil for a
// listing), or says why it does not: only an authenticated API hands them
// out, and a proxy that checks per-lease credentials gets the lease's own,
// signed for it and expiring with it.
func (s *Server) withCredentials(ctx context.Context, info *ProxyInfo, lease *Lease) {
	if !info.hasCreds {
		return
	}
	if _, required := s.opts.Tokens.Token(); !required {
		info.CredentialsWithheld = withheldUnauthenticated
		return
	}
	if s.opts.Credentials == nil {
		info.CredentialsWithheld = withheldUnavailable
		return
	}
	c, err := s.opts.Credentials.Lookup(ctx, info.creds)
	if err == nil && c.Scheme == credentials.SchemeLease {
		if lease == nil {
			info.CredentialsWithheld = withheldPerLease
			return
		}
		c, err = c.SignedFor(info.ID, lease.ID, lease.ExpiresAt)
	}
	if err != nil {
		warn(logf.FromContext(ctx), "proxy credentials unavailable", "proxy", info.ID, "error", err.Error())
		info.CredentialsWithheld = withheldUnavailable
		return
	}
	info.Username, info.Password = c.Username, c.Password
	if info.URL != "" {
		u := url.URL{Scheme: "http", User: c.Userinfo(), Host: net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port)))}
		info.URL = u.String()
	}
}

// Server is the discovery HTTP API.
type Server struct {
	opts   Options
	router *httprouter.Router
	// store is opts.Store, bounded and measured.
	store Store
	// authState remembers the last auth state, to log its changes.
	authState atomic.Int32
	// listeners hear of session reports (the gateway).
	listeners sessionListeners
	// revoker tells proxies of released leases.
	revoker *revoker
}

// NewServer builds the API.
func NewServer(opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Ready == nil {
		opts.Ready = func() bool { return true }
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = DefaultStoreTimeout
	}
	s := &Server{opts: opts, router: httprouter.New(), store: boundedStore{store: opts.Store, timeout: opts.StoreTimeout}, revoker: newRevoker()}
	s.authState.Store(authUnknown)
	r := s.router
	r.GET("/healthz", s.plain("/healthz", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	r.GET("/readyz", s.plain("/readyz", s.readyz))
	r.GET("/v1/proxies", s.authed("/v1/proxies", s.listProxies))
	r.POST("/v1/leases", s.authed("/v1/leases", s.createLease))
	r.GET("/v1/leases/:id", s.authed("/v1/leases/:id", s.getLease))
	r.DELETE("/v1/leases/:id", s.authed("/v1/leases/:id", s.releaseLease))
	r.POST("/v1/leases/:id/renew", s.authed("/v1/leases/:id/renew", s.renewLease))
	r.POST("/v1/leases/:id/report", s.authed("/v1/leases/:id/report", s.report))
	r.POST("/v1/sessions/:session/report", s.authed("/v1/sessions/:session/report", s.reportSession))
	r.GET("/v1/targets/:host", s.authed("/v1/targets/:host", s.getTarget))
	r.GET("/v1/attribution", s.authed("/v1/attribution", s.getAttribution))
	r.HandleMethodNotAllowed = true
	r.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// httprouter has set the Allow header.
		s.count("method_not_allowed", writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s; allowed: %s", req.Method, req.URL.Path, w.Header().Get("Allow"))), 0)
	})
	r.NotFound = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.count("not_found", writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no route %s %s", req.Method, req.URL.Path)), 0)
	})
	r.PanicHandler = func(w http.ResponseWriter, req *http.Request, v any) {
		logf.FromContext(req.Context()).Error(fmt.Errorf("%v", v), "discovery handler panicked", "path", req.URL.Path)
		s.count("panic", writeError(w, http.StatusInternalServerError, "internal", "internal error"), 0)
	}
	return s
}

// Handler is the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.router }

// NeedLeaderElection is false: every replica serves discovery.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, then shuts down gracefully.
func (s *Server) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("discovery")
	if s.opts.WaitForTokens != nil && !s.opts.WaitForTokens(ctx) {
		return fmt.Errorf("discovery API: the token Secret's cache did not sync")
	}
	s.noteAuth(ctx, authStateOf(s.opts.Tokens.Token()))
	go s.revoker.run(ctx)
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("discovery API listening on %s: %w", s.opts.Addr, err)
	}
	srv := &http.Server{Handler: s.router, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.Info("discovery API serving", "addr", l.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("discovery API: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down the discovery API: %w", err)
	}
	return nil
}

// --- handlers ---

// readyz is ready only once the view has synced and the store answers, so
// a Service never routes crawlers to a replica that would wrongly say "no
// proxy available" or fail every lease.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	if code, err := s.ready(r.Context()); err != nil {
		// Unauthenticated: the cause (a Redis address) goes to the log,
		// not to whoever asks.
		logf.FromContext(r.Context()).V(1).Info("discovery not ready", "reason", err.Error())
		msg := "the proxy cache has not synced yet"
		if code == CodeStoreUnavailable {
			msg = "the lease store does not answer"
		}
		writeError(w, http.StatusServiceUnavailable, code, msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ReadyCheck is readyz as a healthz.Checker, for the manager's /readyz,
// which the pod's readiness probe reads.
func (s *Server) ReadyCheck(r *http.Request) error {
	_, err := s.ready(r.Context())
	return err
}

func (s *Server) ready(ctx context.Context) (code string, err error) {
	if !s.opts.Ready() {
		return CodeNotReady, errors.New("the proxy cache has not synced yet")
	}
	if err := s.store.Ping(ctx); err != nil {
		return CodeStoreUnavailable, fmt.Errorf("the lease store does not answer: %w", err)
	}
	return "", nil
}

func (s *Server) listProxies(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	sel, healthy, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	proxies, err := s.visible(r.Context(), s.opts.View.list(sel, healthy))
	if err != nil {
		return authUnavailable(r.Context(), w, err)
	}
	ids := make([]string, len(proxies))
	for i := range proxies {
		ids[i] = proxies[i].ID
	}
	leases, err := s.store.ActiveLeases(r.Context(), ids)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	for i := range proxies {
		proxies[i].ActiveLeases = leases[i]
		s.withCredentials(r.Context(), &proxies[i], nil)
	}
	return writeJSON(w, http.StatusOK, map[string]any{"proxies": proxies})
}

// leaseRequest is the body of POST /v1/leases.
type leaseRequest struct {
	Selector   Selector `json:"selector"`
	TTLSeconds *int64   `json:"ttlSeconds"`
	Target     string   `json:"target"`
	// MaxWaitSeconds is how long the client will wait for a paced
	// target's next slot (default 0: only a slot free now).
	MaxWaitSeconds float64 `json:"maxWaitSeconds"`
}

// MaxLeaseWait bounds a lease request's maxWaitSeconds.
const MaxLeaseWait = time.Minute

// leaseResponse is a lease as the API shows it.
type leaseResponse struct {
	LeaseID   string    `json:"leaseID"`
	Proxy     ProxyInfo `json:"proxy"`
	Target    string    `json:"target,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
	// Paced says, in the answer that created it, that the target's
	// politeness applied: the lease covers one request, at NextRequestAt
	// when that is set (the slot its pace reserved); lease again for the
	// next.
	Paced         bool       `json:"paced,omitempty"`
	NextRequestAt *time.Time `json:"nextRequestAt,omitempty"`
	// State is LeaseActive, or LeaseProxyUnavailable once the proxy is no
	// longer healthy or no longer exists (Reason says which): the lease can
	// no longer be renewed.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Lease states in responses.
const (
	LeaseActive           = "active"
	LeaseProxyUnavailable = "proxy_unavailable"
)

func (s *Server) createLease(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	var req leaseRequest
	if status, code, err := decode(w, r, &req); err != nil {
		return writeError(w, status, code, err.Error())
	}
	ttl, err := s.ttl(req.TTLSeconds)
	if err == nil {
		err = validateSelector("selector", req.Selector)
	}
	if err == nil {
		err = validateTarget(req.Target, false)
	}
	if err == nil && (req.MaxWaitSeconds < 0 || req.MaxWaitSeconds > MaxLeaseWait.Seconds() || math.IsNaN(req.MaxWaitSeconds)) {
		err = fmt.Errorf("maxWaitSeconds must be between 0 and %d, got %v", int(MaxLeaseWait.Seconds()), req.MaxWaitSeconds)
	}
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	req.Target = normalizeTarget(req.Target)
	t := tenantOf(r.Context())
	candidates, err := s.leasableCandidates(r.Context(), t, s.opts.View.candidates(req.Selector))
	if err != nil {
		return authUnavailable(r.Context(), w, err)
	}
	acquire := s.acquireRequest(candidates, req.Target, ttl, time.Duration(req.MaxWaitSeconds*float64(time.Second)))
	acquire.Holder, acquire.Limit = t.Name, s.limitFor(t, LimitLeases)
	lease, err := s.store.Acquire(r.Context(), acquire)
	var quota *QuotaError
	if errors.As(s.quotaError(t, LimitLeases, err), &quota) {
		setRetryAfter(w, max(quota.RetryAfter, time.Second))
		return writeError(w, http.StatusTooManyRequests, CodeQuotaExceeded, quota.Error())
	}
	notePaced(err, lease.Wait)
	var none *NoProxyAvailableError
	if errors.As(err, &none) && none.Paced() {
		setRetryAfter(w, none.RetryAfter)
		return writeError(w, http.StatusTooManyRequests, CodeTargetPaced, fmt.Sprintf(
			"the politeness for target %q allows none of the %d healthy proxies matching selector %v a request within %gs (%s); retry after Retry-After seconds or send a longer maxWaitSeconds",
			req.Target, len(candidates.IDs), map[string]string(req.Selector), req.MaxWaitSeconds, none.Error()))
	}
	if errors.As(err, &none) {
		for _, pool := range s.opts.View.poolsSelected(req.Selector) {
			if err := s.store.NoteRefused(r.Context(), pool); err != nil {
				warn(logf.FromContext(r.Context()), "could not record a refused lease for the pool's autoscaler", "pool", pool, "error", err.Error())
			}
		}
		retry := retryAfterNoProxyBase
		if none.RetryAfter > 0 && len(candidates.IDs) > 0 {
			retry = none.RetryAfter
		}
		setRetryAfter(w, retry)
		msg := fmt.Sprintf("no healthy proxy matches selector %v", map[string]string(req.Selector))
		if len(candidates.IDs) > 0 {
			msg = fmt.Sprintf("all %d healthy proxies matching selector %v are cooling down for target %q", len(candidates.IDs), map[string]string(req.Selector), req.Target)
		}
		return writeError(w, http.StatusServiceUnavailable, CodeNoProxyAvailable, msg)
	}
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	// Only the answer that creates a lease says how it was paced: both
	// stores know it then, and a paced lease covers that one request.
	s.record(r.Context(), LedgerLease, LedgerStart, lease, "", lease.ExpiresAt, 0)
	view := s.leaseView(r.Context(), lease)
	view.Paced = lease.Paced
	if lease.Wait > 0 {
		next := lease.CreatedAt.Add(lease.Wait).UTC()
		view.NextRequestAt = &next
	}
	return writeJSON(w, http.StatusCreated, view)
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	lease, err := s.heldLease(r.Context(), ps.ByName("id"))
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	return writeJSON(w, http.StatusOK, s.leaseView(r.Context(), lease))
}

func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	// Only its holder ends a lease; one gone already (or another tenant's,
	// which this one cannot tell apart) is released all the same.
	lease, err := s.heldLease(r.Context(), ps.ByName("id"))
	switch {
	case errors.Is(err, ErrLeaseNotFound):
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	if err := s.store.Release(r.Context(), lease.ID); err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	s.revoke(r.Context(), lease)
	s.record(r.Context(), LedgerLease, LedgerEnd, lease, "", s.opts.Clock.Now(), 0)
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// renewRequest is the (optional) body of POST /v1/leases/{id}/renew.
type renewRequest struct {
	TTLSeconds *int64 `json:"ttlSeconds"`
}

func (s *Server) renewLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	var req renewRequest
	if r.ContentLength != 0 {
		if status, code, err := decode(w, r, &req); err != nil {
			return writeError(w, status, code, err.Error())
		}
	}
	ttl, err := s.ttl(req.TTLSeconds)
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	lease, err := s.heldLease(r.Context(), ps.ByName("id"))
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	// A lease on a proxy that went away is not extended: the client should
	// lease another. The lease itself lives on until its TTL, so a report
	// on it (a cooldown worth keeping) is still accepted.
	if why := s.opts.View.unavailable(lease.ProxyID); why != "" {
		return writeError(w, http.StatusConflict, CodeProxyUnavailable,
			fmt.Sprintf("lease %q is not renewed: %s; release it and lease another", lease.ID, why))
	}
	if lease, err = s.store.Renew(r.Context(), lease.ID, ttl); err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	s.record(r.Context(), LedgerLease, LedgerRenew, lease, "", lease.ExpiresAt, 0)
	return writeJSON(w, http.StatusOK, s.leaseView(r.Context(), lease))
}

// reportRequest is the body of POST /v1/leases/{id}/report.
type reportRequest struct {
	Result            string `json:"result"`
	Target            string `json:"target"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds"`
}

func (s *Server) report(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	req, cooldown, status, code, err := s.decodeReport(w, r)
	if err != nil {
		return writeError(w, status, code, err.Error())
	}
	target := normalizeTarget(req.Target)
	if !tenantOf(r.Context()).All() {
		if _, err := s.heldLease(r.Context(), ps.ByName("id")); err != nil {
			return leaseError(r.Context(), w, ps.ByName("id"), err)
		}
	}
	if err := s.store.Report(r.Context(), ps.ByName("id"), req.Result, target, cooldown); err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	if req.Result == ResultRateLimited {
		s.pushBack(r.Context(), target, time.Duration(req.RetryAfterSeconds)*time.Second)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// reportSession takes a report on a gateway session's requests: a target
// is required, since a session's route is per host.
func (s *Server) reportSession(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	session := ps.ByName("session")
	if !ValidSessionName(session) {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("session %q must be 1-64 letters, digits, '-' or '_'", session))
	}
	req, cooldown, status, code, err := s.decodeReport(w, r)
	if err == nil && req.Target == "" {
		status, code, err = http.StatusBadRequest, CodeInvalidRequest, errors.New("target is required: a session's route is per host")
	}
	if err != nil {
		return writeError(w, status, code, err.Error())
	}
	target := normalizeTarget(req.Target)
	key := SessionKey(tenantOf(r.Context()), session)
	proxy, err := s.store.ReportSession(r.Context(), key, req.Result, target, cooldown, SessionReportWindow)
	switch {
	case errors.Is(err, ErrSessionNotFound):
		return writeError(w, http.StatusNotFound, CodeSessionNotFound,
			fmt.Sprintf("no gateway session %q has tunnelled lately (it never did, or was idle past its time)", session))
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	if req.Result == ResultRateLimited {
		s.pushBack(r.Context(), target, time.Duration(req.RetryAfterSeconds)*time.Second)
	}
	s.listeners.notify(SessionReport{Session: key, Target: target, Result: req.Result, Proxy: proxy})
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// decodeReport reads and checks a report's body; cooldown is what a
// rate_limited report sets.
func (s *Server) decodeReport(w http.ResponseWriter, r *http.Request) (req reportRequest, cooldown time.Duration, status int, code string, err error) {
	if status, code, err := decode(w, r, &req); err != nil {
		return req, 0, status, code, err
	}
	switch req.Result {
	case ResultOK, ResultError:
		err = validateTarget(req.Target, false)
	case ResultRateLimited:
		err = validateTarget(req.Target, true)
	default:
		err = fmt.Errorf("result must be one of %s, %s, %s; got %q", ResultOK, ResultError, ResultRateLimited, req.Result)
	}
	if err == nil && (req.RetryAfterSeconds < 0 || time.Duration(req.RetryAfterSeconds)*time.Second > MaxReportRetryAfter) {
		err = fmt.Errorf("retryAfterSeconds must be between 0 and %d, got %d", int64(MaxReportRetryAfter/time.Second), req.RetryAfterSeconds)
	}
	if err != nil {
		return req, 0, http.StatusBadRequest, CodeInvalidRequest, err
	}
	return req, max(s.opts.DefaultCooldown, time.Duration(req.RetryAfterSeconds)*time.Second), 0, "", nil
}

// leaseView shows a lease with its proxy as it is now; a proxy deleted since
// shows its id only, and healthy false.
func (s *Server) leaseView(ctx context.Context, l Lease) leaseResponse {
	info, ok := s.opts.View.lookup(l.ProxyID, l.ProxyLeases)
	if !ok {
		info = ProxyInfo{ID: l.ProxyID, Attributes: map[string]string{}}
	}
	s.withCredentials(ctx, &info, &l)
	resp := leaseResponse{LeaseID: l.ID, Proxy: info, Target: l.Target, ExpiresAt: l.ExpiresAt.UTC(), State: LeaseActive}
	if why := s.opts.View.unavailable(l.ProxyID); why != "" {
		resp.State, resp.Reason = LeaseProxyUnavailable, why
	}
	return resp
}

func (s *Server) ttl(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return min(s.opts.DefaultTTL, s.opts.MaxTTL), nil
	}
	if *seconds < 1 {
		return 0, fmt.Errorf("ttlSeconds must be at least 1, got %d", *seconds)
	}
	// Capped rather than refused: the response's expiresAt tells the truth.
	if *seconds > int64(s.opts.MaxTTL/time.Second) {
		return s.opts.MaxTTL, nil
	}
	return time.Duration(*seconds) * time.Second, nil
}

// --- middleware ---

type handle func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int

// authed wraps a handler with bearer-token auth and metrics.
func (s *Server) authed(route string, h handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		start := s.opts.Clock.Now()
		token, required := s.opts.Tokens.Token()
		state := authStateOf(token, required)
		s.noteAuth(r.Context(), state)
		if required {
			got, _ := bearerToken(r.Header.Get("Authorization"))
			t, err := s.identify(r.Context(), got, token)
			if err != nil {
				logf.FromContext(r.Context()).Error(err, "could not review a bearer token")
				setRetryAfter(w, retryAfterStoreUnavailable)
				s.count(route, writeError(w, http.StatusServiceUnavailable, CodeAuthUnavailable,
					"the API server could not review the bearer token; retry after Retry-After seconds"), s.opts.Clock.Since(start))
				return
			}
			if t == nil {
				msg := "a valid bearer token is required (Authorization: Bearer <token>): the discovery token, or a ServiceAccount token for the operator's audience"
				if state == authLocked {
					msg = "the discovery token Secret is missing or has no token: every request with it is refused until a token is there (the operator recreates a deleted one)"
				}
				w.Header().Set("WWW-Authenticate", `Bearer realm="egress-proxies-operator"`)
				s.count(route, writeError(w, http.StatusUnauthorized, CodeUnauthorized, msg), s.opts.Clock.Since(start))
				return
			}
			r = r.WithContext(withTenant(r.Context(), t))
		}
		s.count(route, h(w, r, ps), s.opts.Clock.Since(start))
	}
}

// identify is who presents got: the Platform tenant for the discovery
// token (want; never when it is missing), a ServiceAccount's tenant for a
// token the API server issued for the operator's audience, nil for
// anything else.
func (s *Server) identify(ctx context.Context, got, want string) (*tenant.Tenant, error) {
	switch {
	case got == "":
		return nil, nil
	case want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1:
		return tenant.Platform, nil
	case s.opts.Tenants == nil:
		return nil, nil
	}
	return s.opts.Tenants.Identify(ctx, got)
}

// bearerToken reads an Authorization header of the Bearer scheme, whose name
// is case-insensitive (RFC 9110), trimmed of surrounding whitespace.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func authStateOf(token string, required bool) int32 {
	switch {
	case !required:
		return authOpen
	case token == "":
		return authLocked
	}
	return authEnforced
}

// plain wraps an unauthenticated handler with metrics.
func (s *Server) plain(route string, h httprouter.Handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		start := s.opts.Clock.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h(rec, r, ps)
		s.count(route, rec.status, s.opts.Clock.Since(start))
	}
}

// noteAuth keeps the auth metrics current and logs a change: serving
// unauthenticated is a warning, a lost token an error.
func (s *Server) noteAuth(ctx context.Context, state int32) {
	old := s.authState.Swap(state)
	if old == state {
		return
	}
	authEnabled.Set(boolGauge(state != authOpen))
	authLockedGauge.Set(boolGauge(state == authLocked))
	log := logf.FromContext(ctx).WithName("discovery")
	switch state {
	case authOpen:
		warn(log, "--discovery-auth=none: the discovery API serves UNAUTHENTICATED and hands out no proxy credentials")
	case authLocked:
		log.Error(errors.New("discovery token missing"),
			"the discovery token Secret is missing or has no token key: the API refuses every request until a token is there")
	case authEnforced:
		if old != authUnknown {
			log.Info("discovery API authentication enforced")
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *Server) count(route string, status int, took time.Duration) {
	requestsTotal.WithLabelValues(route, strconv.Itoa(status)).Inc()
	requestDuration.WithLabelValues(route).Observe(took.Seconds())
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// --- decoding and encoding ---

// decode reads a size-limited JSON body strictly: unknown fields and
// trailing data are errors naming what was wrong. The Content-Type header is
// not checked: `curl -d` sends application/x-www-form-urlencoded, and the
// body itself must be JSON whatever the header says.
func decode(w http.ResponseWriter, r *http.Request, into any) (int, string, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Errorf("request body is larger than %d bytes", MaxBodyBytes)
	}
	if err != nil {
		return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("reading the request body: %w", err)
	}
	return decodeJSON(body, into)
}

// decodeJSON is decode without the transport: the part the fuzz test drives.
func decodeJSON(body []byte, into any) (int, string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		var syntax *json.SyntaxError
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return http.StatusBadRequest, CodeInvalidRequest, fmt.Errorf("field %s must be a %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return http.StatusBadRequest, CodeInvalidRequest, fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		case errors.As(err, &syntax), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("request body is not valid JSON: %w", err)
		default:
			return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("request body: %w", err)
		}
	}
	if dec.More() {
		return http.StatusBadRequest, CodeInvalidJSON, errors.New("request body has data after the JSON object")
	}
	return 0, "", nil
}

// parseListQuery reads GET /v1/proxies' query: healthy=true|false, and every
// other parameter an attribute to match.
func parseListQuery(rawQuery string) (Selector, *bool, error) {
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("query string: %w", err)
	}
	sel := Selector{}
	var healthy *bool
	for k, vs := range values {
		if len(vs) != 1 {
			return nil, nil, fmt.Errorf("query parameter %q is given %d times; give it once", k, len(vs))
		}
		if k == "healthy" {
			b, err := strconv.ParseBool(vs[0])
			if err != nil {
				return nil, nil, fmt.Errorf("query parameter healthy must be true or false, got %q", vs[0])
			}
			healthy = &b
			continue
		}
		sel[k] = vs[0]
	}
	if err := validateSelector("query parameter", sel); err != nil {
		return nil, nil, err
	}
	return sel, healthy, nil
}

// normalizeTarget compares targets as hosts: case, a trailing dot and a port
// are ignored, so Example.COM.:443 cools down with example.com.
func normalizeTarget(target string) string {
	if host, _, err := net.SplitHostPort(target); err == nil {
		target = host
	}
	target = strings.TrimSuffix(strings.Trim(target, "[]"), ".")
	return strings.ToLower(target)
}

// validateTarget checks a request's target site: a host name, at most 253
// characters.
func validateTarget(target string, required bool) error {
	switch {
	case target == "" && required:
		return fmt.Errorf("target is required when result is %s", ResultRateLimited)
	case len(target) > 253:
		return errors.New("target is longer than 253 characters")
	case strings.ContainsAny(target, " /\t\n\r"):
		return fmt.Errorf("target must be a host name such as example.com, got %q", target)
	}
	return nil
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, message string) int {
	var body errorBody
	body.Error.Code, body.Error.Message = code, message
	return writeJSON(w, status, body)
}

// leaseError answers a store error about one lease: 404 when the store
// says it is not live, 503 when the store did not answer.
func leaseError(ctx context.Context, w http.ResponseWriter, id string, err error) int {
	if errors.Is(err, ErrLeaseNotFound) {
		return writeError(w, http.StatusNotFound, CodeLeaseNotFound, fmt.Sprintf("lease %q does not exist: it was released or expired (or, with the in-memory lease store, lost when the operator restarted)", id))
	}
	return storeUnavailable(ctx, w, err)
}

// authUnavailable answers 503 auth_unavailable: the API server did not say
// what the tenant may lease.
func authUnavailable(ctx context.Context, w http.ResponseWriter, err error) int {
	logf.FromContext(ctx).Error(err, "could not review what a tenant may lease")
	setRetryAfter(w, retryAfterStoreUnavailable)
	return writeError(w, http.StatusServiceUnavailable, CodeAuthUnavailable,
		"the API server could not say which proxies you may lease; retry after Retry-After seconds")
}

// storeUnavailable answers 503 store_unavailable with a Retry-After. The
// cause goes to the operator's log, not to the client: it names the
// store's address.
func storeUnavailable(ctx context.Context, w http.ResponseWriter, err error) int {
	logf.FromContext(ctx).Error(err, "the lease store did not answer")
	setRetryAfter(w, retryAfterStoreUnavailable)
	return writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the lease store did not answer in time; retry after Retry-After seconds (the operator's log has the cause)")
}

func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
	return status
}

// --- metrics ---

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "requests_total",
		Help: "Discovery API requests by route and HTTP status code.",
	}, []string{"route", "code"})
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "request_duration_seconds",
		Help:    "Discovery API request latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"route"})
	reportsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "reports_total",
		Help: "Lease reports by result (ok, error, rate_limited).",
	}, []string{"result"})
	authEnabled = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "auth_enabled",
		Help: "1 when the discovery API requires a bearer token, 0 when it serves unauthenticated (--discovery-auth=none).",
	})
	authLockedGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "auth_locked",
		Help: "1 while the discovery token Secret is missing or empty: every request is refused.",
	})
)

// metrics are the discovery API's own, registered with the manager's
// registry as every component's are; the store's counts come from its
// Collectors, which read a store instance.
var metrics = []prometheus.Collector{requestsTotal, requestDuration, reportsTotal, authEnabled, authLockedGauge, storeDuration, storeErrors,
	pacedTotal, pacedWaitSeconds, pushBacksTotal, quotaRefusals, revocationsTotal}

func init() {
	ctrlmetrics.Registry.MustRegister(metrics...)
}
