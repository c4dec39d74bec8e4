package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/lease"
)

// Bounds of the API's requests.
const (
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
	CodeProxyNotFound    = "proxy_not_found"
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
	// CodeLocked: the discovery token Secret is missing or its key empty
	// (the platform's lock): every client is refused, ServiceAccount
	// tokens included, with Retry-After, until a token is there.
	CodeLocked = "locked"
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

// Options configure a Server.
type Options struct {
	// Addr is the listen address; "0" disables the server.
	Addr string
	// DefaultTTL, MaxTTL bound lease lifetimes; DefaultCooldown is the
	// rate_limited cooldown when the client asks for less.
	DefaultTTL, MaxTTL, DefaultCooldown time.Duration
	// Store keeps leases; View lists proxies; Tokens authenticates.
	Store lease.Store
	// StoreTimeout bounds each store call (lease.DefaultStoreTimeout when 0).
	StoreTimeout time.Duration
	View         *broker.View
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
	Credentials broker.CredentialsLookup
	// Politeness paces the hosts leases and tunnels target.
	Politeness broker.Politeness
	// Tenants, when set, accepts bearer tokens other than the discovery
	// token (ServiceAccount tokens) and narrows each such tenant to the
	// proxies RBAC lets it lease. Nil: the discovery token only.
	Tenants broker.Tenants
	// Quotas bounds each tenant's share (TenantQuotas). Nil: no limits.
	Quotas broker.Quotas
	// TenantReviewTTL is how long a tenant's narrowed candidates are
	// reused (broker.Options.TenantReviewTTL); 0 narrows every request.
	TenantReviewTTL time.Duration
	// Ledger receives every ledger record (the JSON-lines log); the store
	// keeps them for LedgerRetention (DefaultLedgerRetention when 0).
	Ledger          lease.LedgerSink
	LedgerRetention time.Duration
	// Prices are each provider instance's prices, for GET /v1/usage's
	// cost (none: no cost); the store keeps each day's usage
	// UsageRetention after it (lease.DefaultUsageRetention when 0).
	Prices         map[string]broker.Price
	UsageRetention time.Duration
	// InspectCA is each tenant's inspecting CA (the gateway's -inspect);
	// GET /v1/inspect/ca hands a tenant its certificate. Nil: off.
	InspectCA inspect.Authority
}

// withheldUnauthenticated: why an open API shows no credentials.
const withheldUnauthenticated = "the discovery API runs unauthenticated (--discovery-auth=none), so it never hands out proxy credentials: run it with --discovery-auth=required (the default; see docs/security.md) and send Authorization: Bearer <token>"

// withCredentials fills in a proxy's credentials for lease (nil for a
// listing), or says why it does not: only an authenticated API hands them
// out (the broker signs them).
func (s *Server) withCredentials(ctx context.Context, info *broker.ProxyInfo, l *lease.Lease) {
	if _, required := s.opts.Tokens.Token(); !required && info.NeedsCredentials() {
		info.CredentialsWithheld = withheldUnauthenticated
		return
	}
	s.broker.WithCredentials(ctx, info, l)
}

// Server is the discovery HTTP API.
type Server struct {
	opts   Options
	router *httprouter.Router
	// broker decides every lease; store is its lease store, bounded and
	// measured.
	broker *broker.Broker
	store  lease.Store
	// authState remembers the last auth state, to log its changes.
	authState atomic.Int32
}

// NewServer builds the API.
func NewServer(opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Ready == nil {
		opts.Ready = func() bool { return true }
	}
	b := broker.New(broker.Options{
		DefaultTTL: opts.DefaultTTL, MaxTTL: opts.MaxTTL, DefaultCooldown: opts.DefaultCooldown,
		Store: opts.Store, StoreTimeout: opts.StoreTimeout, View: opts.View, Clock: opts.Clock, Credentials: opts.Credentials,
		Politeness: opts.Politeness, Tenants: opts.Tenants, Quotas: opts.Quotas, TenantReviewTTL: opts.TenantReviewTTL,
		Ledger: opts.Ledger, LedgerRetention: opts.LedgerRetention, Prices: opts.Prices, UsageRetention: opts.UsageRetention,
	})
	s := &Server{opts: opts, router: httprouter.New(), broker: b, store: b.Store()}
	s.authState.Store(authUnknown)
	r := s.router
	r.GET("/healthz", s.plain("/healthz", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	r.GET("/readyz", s.plain("/readyz", s.readyz))
	r.GET("/v1/proxies", s.authed("/v1/proxies", s.listProxies))
	r.GET("/v1/proxies/:namespace/:name", s.authed("/v1/proxies/:namespace/:name", s.getProxy))
	r.POST("/v1/leases", s.authed("/v1/leases", s.createLease))
	r.GET("/v1/leases/:id", s.authed("/v1/leases/:id", s.getLease))
	r.DELETE("/v1/leases/:id", s.authed("/v1/leases/:id", s.releaseLease))
	r.POST("/v1/leases/:id/renew", s.authed("/v1/leases/:id/renew", s.renewLease))
	r.POST("/v1/leases/:id/report", s.authed("/v1/leases/:id/report", s.report))
	r.POST("/v1/sessions/:session/report", s.authed("/v1/sessions/:session/report", s.reportSession))
	r.GET("/v1/targets/:host", s.authed("/v1/targets/:host", s.getTarget))
	r.GET("/v1/attribution", s.authed("/v1/attribution", s.getAttribution))
	r.GET("/v1/usage", s.authed("/v1/usage", s.getUsage))
	r.GET("/v1/inspect/ca", s.authed("/v1/inspect/ca", s.getInspectCA))
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

// Outcomes is the lease store's outcome memory, each call bounded and
// measured as the API's are: for the ban judge and the Proxy reconciler.
func (s *Server) Outcomes() lease.OutcomeMemory { return s.store }

// Broker is the acquire path the API serves: the gateway takes the same.
func (s *Server) Broker() *broker.Broker { return s.broker }

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
	go s.broker.Run(ctx)
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

// --- middleware ---

// --- decoding and encoding ---

// --- metrics ---
