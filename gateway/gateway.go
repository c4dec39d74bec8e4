// Package gateway is the rotating gateway: an HTTP proxy any crawler can
// point at (http://<session>:<token>@<gateway>:3128) that carries each
// CONNECT tunnel, and each plain-HTTP request, through one of the fleet's
// proxies. The broker picks that proxy, on the path the lease API takes:
// the session's own while it is healthy and not cooling down for the host,
// else the least-loaded one that is not. A failed upstream is retried
// on another, a bounded number of times. The username is read in the
// dotted form or the commercial providers' grammar (ParseUsername): a
// strict session keeps its exit IP or fails, a lifetime renews or ends a
// session, an exclusive one holds its proxy alone. Every answer says what
// happened: the proxy and exit IP on what it carried, an RFC 9209
// Proxy-Status on what it refused (answers.go).
//
// It never looks inside a tunnel (no TLS interception), and bounds what it
// holds: a cap on open tunnels (beyond it, clients wait briefly, then get
// 503), idle and total timeouts, and no buffer for a tunnel with nothing
// to carry.
//
// It reaches proxies and leases through the broker only (Upstreams, which
// the discovery API's Tunnels joins with its Authorize): it never imports
// discovery, never reads or writes the Kubernetes API and never imports
// the controllers, the providers or the health engine (depguard enforces
// the imports).
package gateway

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/tracing"
)

// Defaults for the gateway's flags.
const (
	DefaultMaxTunnels        = 10000
	DefaultAttempts          = 3
	DefaultConnectTimeout    = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxTunnelLifetime = time.Hour
	DefaultSlotWait          = 2 * time.Second
	DefaultLeaseTTL          = 2 * time.Minute
	DefaultSessionIdle       = 30 * time.Minute
	// DefaultPaceWait is how long a tunnel or request may wait for its
	// host's next paced slot before the client is told 429.
	DefaultPaceWait = 5 * time.Second
	// DefaultPacedTunnelLifetime bounds a tunnel to a paced host, so its
	// session's tunnels follow the host's pace to other proxies now and
	// then. Its requests are paced one by one; closing it cuts what it
	// carries (an HTTP/2 client loses every stream in flight), so rarely.
	DefaultPacedTunnelLifetime = 10 * time.Minute
)

// ProxyStatusName names the gateway in the Proxy-Status header (RFC 9209).
const ProxyStatusName = "egress-proxies-operator"

// HeaderUpstream names, in a CONNECT reply and a forwarded response, the
// proxy that carried it (namespace/name).
const HeaderUpstream = "X-Egress-Proxy"

// lockedRetryAfter is the Retry-After of the 503 a gateway without a
// token answers: a configuration change, not a moment's load.
// reviewRetryAfter is that of a 503 when the API server could not review
// a ServiceAccount token.
const (
	lockedRetryAfter = broker.LockedRetryAfter
	reviewRetryAfter = 2 * time.Second
)

// realm is the Basic realm of the gateway's 407s.
const realm = `Basic realm="egress-proxies-operator gateway"`

// Options configure a Gateway; zero values take the defaults above.
type Options struct {
	// Addr is the listen address ("" or "0": no gateway).
	Addr      string
	Upstreams Upstreams
	// MaxTunnels caps open tunnels and in-flight plain requests; a client
	// beyond it waits up to SlotWait for a place, then gets 503.
	MaxTunnels int
	SlotWait   time.Duration
	// Attempts bounds the upstreams one tunnel tries.
	Attempts int
	// ConnectTimeout bounds reaching an upstream and its CONNECT answer.
	ConnectTimeout time.Duration
	// IdleTimeout closes a tunnel that carried nothing either way for that
	// long; MaxTunnelLifetime closes any tunnel that old.
	IdleTimeout, MaxTunnelLifetime time.Duration
	// LeaseTTL is a tunnel's lease, renewed while it lasts; SessionIdle is
	// how long a session's route outlives its last tunnel.
	LeaseTTL, SessionIdle time.Duration
	// PaceWait is how long a client's tunnel or request may wait for its
	// host's next paced slot; beyond it the client gets 429. Negative:
	// never wait.
	PaceWait time.Duration
	// SessionMaxErrorScore retires a session's stint on one proxy once its
	// error score reaches it (broker.TunnelRequest.MaxErrorScore; zero:
	// never).
	SessionMaxErrorScore float64
	// PacedTunnelLifetime closes a tunnel to a paced host that old.
	PacedTunnelLifetime time.Duration
	// Destinations are the ports and addresses the fleet's proxies take;
	// the gateway refuses the rest before it picks a proxy.
	Destinations Destinations
	// Inspect is the opt-in inspecting mode (off without an Authority).
	Inspect Inspect
	// OnUnreachable, if set, is told of each proxy a tunnel or request
	// could not reach or that spoke no proxy's answer (a dial error, no
	// CONNECT answer in time, an answer that is not HTTP, our credentials
	// refused): the replica that probes it probes it at once
	// (health.Engine.AskProbe) rather than at its next turn, which for an
	// idle proxy may be minutes away. A refusal or a site's failure is not the proxy's, and is not
	// told.
	OnUnreachable func(proxyID string)
	// BlockMarkers are strings whose presence in the first 64 KiB of a
	// 200 HTML answer the gateway sees (plain HTTP, inspected) makes it a
	// block page: a blocked outcome, as a 403 is.
	BlockMarkers []string
}

func (o *Options) defaults() {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	if o.MaxTunnels <= 0 {
		o.MaxTunnels = DefaultMaxTunnels
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	set(&o.SlotWait, DefaultSlotWait)
	set(&o.ConnectTimeout, DefaultConnectTimeout)
	set(&o.IdleTimeout, DefaultIdleTimeout)
	set(&o.MaxTunnelLifetime, DefaultMaxTunnelLifetime)
	set(&o.LeaseTTL, DefaultLeaseTTL)
	set(&o.SessionIdle, DefaultSessionIdle)
	set(&o.PacedTunnelLifetime, DefaultPacedTunnelLifetime)
	if o.PaceWait < 0 {
		o.PaceWait = 0
	} else if o.PaceWait == 0 {
		o.PaceWait = DefaultPaceWait
	}
}

// Gateway is the rotating gateway's HTTP proxy server.
type Gateway struct {
	opts  Options
	slots chan struct{}
	// forwarder carries plain-HTTP requests through their upstream.
	forwarder *http.Transport

	mu      sync.Mutex
	tunnels map[*tunnel]struct{}
	// inspector carries inspected requests; minter mints their sites'
	// certificates.
	inspector *http.Transport
	minter    inspect.Minter
}

// New builds a gateway; Start serves it.
func New(opts Options) *Gateway {
	opts.defaults()
	g := &Gateway{opts: opts, slots: make(chan struct{}, opts.MaxTunnels), tunnels: map[*tunnel]struct{}{}}
	g.forwarder = &http.Transport{
		Proxy:                 upstreamOf,
		GetProxyConnectHeader: sessionAddressHeader,
		DialContext:           (&net.Dialer{Timeout: opts.ConnectTimeout}).DialContext,
		ResponseHeaderTimeout: opts.MaxTunnelLifetime,
		IdleConnTimeout:       opts.IdleTimeout,
		MaxIdleConnsPerHost:   8,
		DisableCompression:    true, // the client's Accept-Encoding goes through as sent
	}
	g.inspector = inspectTransport(g.forwarder, opts)
	return g
}

// NeedLeaderElection is false: every replica serves the gateway.
func (g *Gateway) NeedLeaderElection() bool { return false }

// Start serves until ctx ends, renewing open tunnels' leases meanwhile;
// then it stops taking tunnels and closes those still open.
func (g *Gateway) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("gateway")
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", g.opts.Addr)
	if err != nil {
		return fmt.Errorf("gateway: listening on %s: %w", g.opts.Addr, err)
	}
	srv := &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 10 * time.Second,
		// A keep-alive connection between plain-HTTP requests is idle too.
		IdleTimeout:    g.opts.IdleTimeout,
		MaxHeaderBytes: 32 << 10,
		BaseContext:    func(net.Listener) context.Context { return logf.IntoContext(context.Background(), log) },
	}
	go g.renewLeases(ctx, log)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("rotating gateway listening", "addr", lis.Addr().String(), "maxTunnels", g.opts.MaxTunnels)
	select {
	case err := <-errc:
		return fmt.Errorf("gateway: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown) // hijacked tunnels are not the server's: closed below
	g.closeAll()
	g.forwarder.CloseIdleConnections()
	return nil
}

// destinationRefused is the gateway's 403 to a CONNECT or plain-HTTP
// request whose port or address the fleet's proxies refuse (nil when they
// take it); a request that names no host:port is left to its handler.
func (g *Gateway) destinationRefused(r *http.Request) *answer {
	var host, port string
	connect := r.Method == http.MethodConnect
	switch {
	case connect:
		var err error
		if host, port, err = net.SplitHostPort(r.Host); err != nil {
			return nil
		}
	case r.URL.IsAbs():
		host, port = r.URL.Hostname(), r.URL.Port()
		if port == "" {
			port = "80"
		}
	default:
		return nil
	}
	errType, msg := g.opts.Destinations.refusal(host, port, connect)
	if errType == "" {
		return nil
	}
	status := http.StatusForbidden
	if errType == psHTTPRequestError {
		status = http.StatusBadRequest
	}
	return &answer{status: status, errType: errType, cause: CauseDestination, msg: msg}
}

// ServeHTTP authenticates the client, then tunnels a CONNECT or forwards a
// plain-HTTP request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, refused := g.authenticate(r)
	if refused != nil {
		refused.write(w, r)
		return
	}
	if refused := g.destinationRefused(r); refused != nil {
		refused.write(w, r)
		return
	}
	// A client's traceparent makes the gateway's spans part of its trace.
	r = r.WithContext(tracing.FromRequest(r))
	if err := g.opts.Upstreams.Admit(r.Context(), id.Tenant); err != nil {
		pickAnswer(err, nil).write(w, r)
		return
	}
	switch {
	case r.Method == http.MethodConnect:
		g.tunnel(w, r, id)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		g.forward(w, r, id)
	default:
		answer{status: http.StatusBadRequest, errType: psHTTPRequestError, cause: CauseBadRequest,
			msg: "the gateway is an HTTP proxy: send CONNECT host:port for HTTPS, or an absolute http:// URL"}.write(w, r)
	}
}

// authenticate reads the client's Proxy-Authorization: the username is the
// session and selector (ParseUsername), the password the discovery token
// or the client's ServiceAccount token.
func (g *Gateway) authenticate(r *http.Request) (Identity, *answer) {
	user, password, ok := proxyBasicAuth(r.Header.Get("Proxy-Authorization"))
	who, err := g.opts.Upstreams.Authorize(tenant.WithClient(r.Context(), r.RemoteAddr), password)
	switch {
	case errors.Is(err, broker.ErrGatewayLocked):
		// Everyone alike, with or without credentials: nothing they send
		// can help until the operator has a token.
		return Identity{}, &answer{status: http.StatusServiceUnavailable, errType: psProxyConfigError, cause: CauseGatewayLocked,
			msg: err.Error(), retryAfter: lockedRetryAfter}
	case !ok:
		return Identity{}, &answer{status: http.StatusProxyAuthRequired, errType: psHTTPRequestDenied, cause: CauseAuthRequired,
			msg: "proxy credentials required: http://<session>:<discovery token or ServiceAccount token>@<gateway>"}
	case errors.Is(err, broker.ErrWrongToken):
		return Identity{}, &answer{status: http.StatusProxyAuthRequired, errType: psHTTPRequestDenied, cause: CauseWrongPassword, msg: err.Error()}
	case err != nil:
		logf.FromContext(r.Context()).Error(err, "gateway: could not check a client's password")
		return Identity{}, &answer{status: http.StatusServiceUnavailable, errType: psProxyInternalError, cause: CauseAuthUnavailable,
			msg: "the gateway could not check the proxy password; retry", retryAfter: reviewRetryAfter}
	}
	id, err := ParseUsername(user)
	if err != nil {
		return Identity{}, &answer{status: http.StatusBadRequest, errType: psHTTPRequestError, cause: CauseBadUsername, msg: "proxy username: " + err.Error()}
	}
	id.Tenant = who
	return id, nil
}

// proxyBasicAuth parses a Proxy-Authorization header of the Basic scheme.
func proxyBasicAuth(header string) (user, password string, ok bool) {
	scheme, encoded, found := strings.Cut(strings.TrimSpace(header), " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(encoded))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(raw), ":")
}

// takeSlot waits up to SlotWait for a place under MaxTunnels.
func (g *Gateway) takeSlot(ctx context.Context) bool {
	select {
	case g.slots <- struct{}{}:
		return true
	default:
	}
	timer := time.NewTimer(g.opts.SlotWait)
	defer timer.Stop()
	select {
	case g.slots <- struct{}{}:
		return true
	case <-timer.C:
	case <-ctx.Done():
	}
	return false
}

func (g *Gateway) freeSlot() { <-g.slots }

// connectionPoll is how often a tunnel held back by its host's connection
// limit asks again: a tunnel that ends frees its place without telling.
const connectionPoll = 25 * time.Millisecond

// pick asks discovery for an upstream. While every proxy is at its
// connection limit for the host, it asks again until PaceWait has passed;
// a paced slot within what is left of that wait is reserved at once.
func (g *Gateway) pick(ctx context.Context, req broker.TunnelRequest) (up broker.Upstream, err error) {
	ctx, span := tracing.Tracer(tracerName).Start(ctx, "pick")
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(tracing.KeyProxy.String(up.ProxyID), tracing.KeyExitIP.String(up.ExitIP), tracing.KeyPaceWait.Float64(up.Wait.Seconds()))
		}
		span.End()
	}()
	deadline := time.Now().Add(max(g.opts.PaceWait, 0))
	for {
		req.MaxWait = max(time.Until(deadline), 0)
		up, err = g.opts.Upstreams.Tunnel(ctx, req)
		var none *lease.NoProxyAvailableError
		if !errors.As(err, &none) || none.Cause != lease.CauseConcurrency || time.Until(deadline) <= 0 {
			return up, err
		}
		if !sleep(ctx, min(connectionPoll, time.Until(deadline))) {
			return up, err
		}
	}
}

// tracerName names the gateway's spans' instrumentation scope.
const tracerName = "github.com/example/egress-proxies-operator/gateway"

// startSpan starts the span of a client's tunnel or request, in the trace
// its traceparent names (a new one without).
func startSpan(ctx context.Context, name string, id Identity, host string) (context.Context, trace.Span) {
	who := tenant.Anonymous.Name
	if id.Tenant != nil {
		who = id.Tenant.Name
	}
	return tracing.Tracer(tracerName).Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(tracing.KeyTenant.String(who), tracing.KeySession.String(id.Session), tracing.KeyHost.String(host)))
}

// endSpan ends a tunnel's or request's span with its outcome (a close
// reason, an answer's cause, "ok").
func endSpan(span trace.Span, outcome string) {
	span.SetAttributes(tracing.KeyOutcome.String(outcome))
	span.End()
}

// paceWaitSpan records the wait for a paced host's slot the pick reserved,
// as the span it will be: from now until the slot.
func paceWaitSpan(ctx context.Context, wait time.Duration) {
	if wait <= 0 {
		return
	}
	now := time.Now()
	_, span := tracing.Tracer(tracerName).Start(ctx, "pace wait", trace.WithTimestamp(now), trace.WithAttributes(tracing.KeyPaceWait.Float64(wait.Seconds())))
	span.End(trace.WithTimestamp(now.Add(wait)))
}

// sleep waits d, or less when ctx ends first (then false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// renewLeases extends every open tunnel's lease at a third of its TTL, so a
// tunnel keeps counting toward its proxy's load while it lasts and a
// crashed gateway's leases end within a TTL.
func (g *Gateway) renewLeases(ctx context.Context, log logr.Logger) {
	ticker := time.NewTicker(g.opts.LeaseTTL / 3)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		holds := map[string]bool{}
		for _, t := range g.open() {
			if t.inspected {
				continue // each of its requests holds a lease of its own, while it goes
			}
			g.meter(ctx, t, 1)
			recorded, err := g.opts.Upstreams.RenewTunnel(ctx, t.up.LeaseID, t.name, g.opts.LeaseTTL, t.ledgerUntil)
			t.ledgerUntil = recorded
			switch {
			case errors.Is(err, lease.ErrLeaseNotFound):
				// Its lease ran out (renewals failed for its whole TTL):
				// a tunnel no lease counts would escape its tenant's
				// maxTunnels and its proxy's load, so it ends.
				log.Info("a tunnel's lease is gone; closing the tunnel", "proxy", t.up.ProxyID, "lease", t.up.LeaseID, "session", t.name)
				t.close(closedLeaseLost)
				continue
			case err != nil && ctx.Err() == nil:
				log.V(1).Info("renewing a tunnel's lease failed", "proxy", t.up.ProxyID, "lease", t.up.LeaseID, "error", err.Error())
			}
			if t.up.Hold == "" || holds[t.up.Hold] {
				continue
			}
			// The session's exclusive hold lasts while its tunnels do.
			holds[t.up.Hold] = true
			if _, err := g.opts.Upstreams.RenewTunnel(ctx, t.up.Hold, t.name, g.opts.SessionIdle, time.Time{}); err != nil && ctx.Err() == nil {
				log.V(1).Info("renewing a session's exclusive hold failed", "proxy", t.up.ProxyID, "lease", t.up.Hold, "error", err.Error())
			}
		}
	}
}

func (g *Gateway) open() []*tunnel {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*tunnel, 0, len(g.tunnels))
	for t := range g.tunnels {
		out = append(out, t)
	}
	return out
}

// CloseTunnels closes a session's open tunnels to host through proxy: a
// report that the host rate-limits the session there, so the client's
// next request opens a tunnel that goes elsewhere. It returns how many it
// closed. (A tunnel open on another replica is not closed; the client's
// next connection is routed right wherever it lands.)
func (g *Gateway) CloseTunnels(session, host, proxy string) int {
	n := 0
	for _, t := range g.open() {
		if t.session == session && t.host == host && t.up.ProxyID == proxy {
			t.close(closedReported)
			n++
		}
	}
	return n
}

// OnSessionReport is a broker session-report listener: a
// rate_limited report closes the session's tunnels to that host.
func (g *Gateway) OnSessionReport(r broker.SessionReport) {
	if r.Result == lease.ResultRateLimited {
		g.CloseTunnels(r.Session, r.Target, r.Proxy)
	}
}

// meter counts the bytes t carried since its last count toward its
// tenant's bytes-per-day quota, once at least least of them are
// uncounted; when the day's bytes are spent, every tunnel of the tenant
// here is cut (other replicas cut theirs at their next count).
func (g *Gateway) meter(ctx context.Context, t *tunnel, least int64) {
	if !t.metered {
		return
	}
	t.meterMu.Lock()
	n := t.moved() - t.counted
	if n < max(least, 1) {
		t.meterMu.Unlock()
		return
	}
	t.counted += n
	t.meterMu.Unlock()
	if g.opts.Upstreams.CountBytes(ctx, t.who, n) {
		g.cutTenant(t.who.Name)
	}
}

// cutTenant closes the open tunnels of the tenant called name: its day's
// bytes are spent.
func (g *Gateway) cutTenant(name string) {
	for _, t := range g.open() {
		if t.metered && t.who.Name == name {
			t.close(closedQuota)
		}
	}
}

func (g *Gateway) closeAll() {
	for _, t := range g.open() {
		t.close(closedShutdown)
	}
}

func (g *Gateway) register(t *tunnel) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tunnels[t] = struct{}{}
	tunnelsOpen.Set(float64(len(g.tunnels)))
}

func (g *Gateway) unregister(t *tunnel) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.tunnels, t)
	tunnelsOpen.Set(float64(len(g.tunnels)))
}

// Open is the number of open tunnels.
func (g *Gateway) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.tunnels)
}
