package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/example/egress-proxies-operator/lease"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/tenant"
)

// Errors of the gateway's side of discovery.
var (
	// ErrGatewayLocked: the discovery API runs unauthenticated
	// (--discovery-auth=none), or its token Secret is missing or its key
	// emptied (the platform's lock), so the gateway refuses everyone,
	// ServiceAccount tokens included, as the API does.
	ErrGatewayLocked = errors.New("the gateway needs the discovery token: run the operator with --discovery-auth=required and the token Secret in place with a token (an emptied key locks the API and the gateway for everyone; see docs/security.md)")
	// ErrWrongToken: the client's password is not the discovery token.
	ErrWrongToken = errors.New("the proxy password must be the discovery API token or a ServiceAccount token for the operator's audience")
	// ErrInvalidTunnel: the request cannot be served as asked (a bad
	// session name or selector, no host).
	ErrInvalidTunnel = errors.New("invalid tunnel request")
)

// SessionReportWindow is how long after a session's rate_limited report for
// a host further ones are taken as the same burst: a crawler that keeps
// connections open (Scrapy) has several requests in flight through the
// same proxy when the first refusal comes, and reports each. Taken apart,
// the late ones would cool the proxy the session moved to.
const SessionReportWindow = 10 * time.Second

// sessionName is what a gateway session may be called: the proxy URL's
// username carries it, and the API's path names it in reports.
var sessionName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidSessionName says whether name may name a gateway session.
func ValidSessionName(name string) bool { return sessionName.MatchString(name) }

// Tunnels is discovery's side of the rotating gateway: it checks the
// gateway's clients against the discovery token and picks each tunnel's
// upstream from the same view and lease store the lease API uses, so a
// tunnel counts toward its proxy's load, avoids its cooldowns, and sticks to
// its session's proxy across every replica sharing the store.
type Tunnels struct {
	s *Server
}

// Tunnels returns the server's side of the gateway.
func (s *Server) Tunnels() *Tunnels { return &Tunnels{s: s} }

// Authorize is the tenant a gateway client's password names: the
// discovery token, or a ServiceAccount token for the operator's audience.
// ErrGatewayLocked comes first, whatever the password (even none): a
// gateway that can check no token refuses everyone alike.
func (t *Tunnels) Authorize(ctx context.Context, password string) (*tenant.Tenant, error) {
	token, required := t.s.opts.Tokens.Token()
	if authStateOf(token, required) != authEnforced {
		return nil, ErrGatewayLocked
	}
	who, err := t.s.identify(ctx, password, token)
	switch {
	case err != nil:
		return nil, fmt.Errorf("reviewing the proxy password: %w", err)
	case who == nil:
		return nil, ErrWrongToken
	}
	return who, nil
}

// TunnelRequest asks for an upstream for one tunnel.
type TunnelRequest struct {
	// Tenant is who asks (Authorize): the tunnel goes only through proxies
	// it may lease, and its sessions are its own. Nil: Anonymous.
	Tenant *tenant.Tenant
	// Session sticks the tunnel to the session's own proxy; "" rotates:
	// every tunnel goes to the least-loaded proxy.
	Session string
	// Strict keeps a session on its own proxy and exit IP or fails it (a
	// *SessionLostError); a soft session moves to another proxy instead.
	Strict bool
	// Lifetime bounds a session's stint on one proxy (zero: none): past
	// it, a soft session takes a new proxy and a strict one ends.
	Lifetime time.Duration
	// Exclusive holds the session's own proxy alone while the session
	// lives: no other lease or session gets it.
	Exclusive bool
	// Restart says the session's stint began with this tunnel's last
	// attempt, which failed: a strict session has not used that proxy
	// yet, so it may still start on another.
	Restart bool
	// Selector restricts the upstreams, as a lease's does.
	Selector Selector
	// Host is the tunnel's target host (a port is ignored).
	Host string
	// Avoid are proxies that already failed this tunnel.
	Avoid []string
	// TTL is the tunnel lease's; the gateway renews it while the tunnel
	// lasts. SessionIdle is how long a session's route (and its exclusive
	// hold) outlives its last tunnel.
	TTL, SessionIdle time.Duration
	// MaxWait is how long the tunnel may wait for a paced host's next
	// slot.
	MaxWait time.Duration
}

// Upstream is the proxy one tunnel goes through, on a lease of its own.
type Upstream struct {
	ProxyID string
	// Address is the proxy's host:port; ExitIP where sites see the
	// tunnel come from.
	Address, ExitIP string
	// User are the proxy's credentials (nil: it needs none).
	User    *url.Userinfo
	LeaseID string
	// Hold is the exclusive lease holding the proxy for the tunnel's
	// session ("": none): the gateway renews it with the tunnel's.
	Hold string
	// Fresh says this tunnel starts the session's stint on the proxy.
	Fresh bool
	// Wait is how long the tunnel must wait before it goes: the slot its
	// host's pace reserved.
	Wait time.Duration
	// Paced says whether a pace or concurrency limit applies to the
	// tunnel's host: the gateway then bounds the tunnel's lifetime.
	Paced bool
	// LedgerUntil is how far the tunnel's start record says it holds its
	// IP (TunnelLedgerHorizon): the gateway hands it to Renew.
	LedgerUntil time.Time
}

// Why a strict session failed (SessionLostError.Cause).
const (
	// SessionProxyGone: its proxy no longer exists, or no longer serves.
	SessionProxyGone = "proxy_gone"
	// SessionProxyUnhealthy: its proxy is not healthy.
	SessionProxyUnhealthy = "proxy_unhealthy"
	// SessionProxyFailed: its proxy failed this tunnel.
	SessionProxyFailed = "proxy_failed"
	// SessionCooling: its proxy is cooling down for the host.
	SessionCooling = "cooling"
	// SessionIPChanged: its proxy is back, on another exit IP.
	SessionIPChanged = "ip_changed"
	// SessionTaken: its exclusive hold ran out and another holds the proxy.
	SessionTaken = "proxy_taken"
	// SessionEnded: its lifetime is over.
	SessionEnded = "ended"
)

// SessionLostError says a strict session cannot go on: its tunnels would
// leave from another exit IP. The client starts a new session.
type SessionLostError struct {
	Session, Proxy, IP string
	// Cause is one of the Session* causes above.
	Cause string
}

func (e *SessionLostError) Error() string {
	if e.Cause == SessionEnded {
		return fmt.Sprintf("strict session %q ended: its lifetime on proxy %s (%s) is over; start a new session", e.Session, e.Proxy, e.IP)
	}
	return fmt.Sprintf("strict session %q lost its proxy %s (%s): %s; start a new session", e.Session, e.Proxy, e.IP, strings.ReplaceAll(e.Cause, "_", " "))
}

// Pick leases the upstream for a tunnel: the session's own proxy while it
// is healthy and not cooling down for the host; else the proxy the session
// last took to that host instead, if it still may; else the least-loaded
// healthy one not cooling down for the host. The session moves to that
// last one only when its own proxy is gone, unhealthy or failed this
// tunnel, or its lifetime there is over; a cooldown for one host leaves it
// where it is for the others. A strict session never moves: it fails with
// a *SessionLostError. With nothing available it returns a
// *NoProxyAvailableError.
func (t *Tunnels) Pick(ctx context.Context, req TunnelRequest) (Upstream, error) {
	if req.Session != "" && !ValidSessionName(req.Session) {
		return Upstream{}, fmt.Errorf("%w: session %q must be 1-64 letters, digits, '-' or '_'", ErrInvalidTunnel, req.Session)
	}
	if req.Session == "" && (req.Strict || req.Exclusive || req.Lifetime > 0) {
		return Upstream{}, fmt.Errorf("%w: strict, exclusive and a lifetime need a session", ErrInvalidTunnel)
	}
	if err := validateSelector("selector", req.Selector); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	host := normalizeTarget(req.Host)
	if err := validateTarget(host, true); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	who := req.Tenant
	if who == nil {
		who = tenant.Anonymous
	}
	candidates, err := t.s.leasableCandidates(ctx, who, t.s.opts.View.candidates(req.Selector))
	if err != nil {
		return Upstream{}, err
	}
	p := &pick{t: t, req: req, who: who, host: host, session: SessionKey(who, req.Session), candidates: candidates,
		avoid: slices.Clone(req.Avoid), limit: t.s.limitFor(who, LimitTunnels)}
	if req.Session != "" {
		if p.route, err = t.s.store.Route(ctx, p.session, host); err != nil {
			return Upstream{}, err
		}
	}
	if req.Strict && p.route.Own != "" && !req.Restart {
		return p.strict(ctx)
	}
	return p.soft(ctx)
}

// pick is one tunnel's choice of upstream.
type pick struct {
	t          *Tunnels
	req        TunnelRequest
	who        *tenant.Tenant
	host       string
	session    string
	candidates lease.Candidates
	avoid      []string
	limit      lease.Limit
	route      lease.Route
}

func (p *pick) acquire(ctx context.Context, c lease.Candidates, maxWait time.Duration, exclusive bool, within string) (lease.Lease, error) {
	r := p.t.s.acquireRequest(c, p.host, p.req.TTL, maxWait)
	r.Holder, r.Limit, r.Exclusive, r.Within = p.who.Name, p.limit, exclusive, within
	if exclusive {
		// The hold outlives a tunnel: it lasts while the session does.
		r.TTL, r.Target, r.PaceOf, r.Adaptive, r.Limit = p.req.SessionIdle, "", nil, false, lease.Limit{}
	}
	l, err := p.t.s.store.Acquire(ctx, r)
	return l, p.t.s.quotaError(p.who, LimitTunnels, err)
}

func (p *pick) usable(id string) bool {
	_, found := slices.BinarySearch(p.candidates.IDs, id)
	return id != "" && found && !slices.Contains(p.avoid, id)
}

// expired says whether the session's stint on its own proxy is over.
func (p *pick) expired() bool {
	return p.req.Lifetime > 0 && p.route.Own != "" && !p.route.Since.IsZero() &&
		p.t.s.opts.Clock.Since(p.route.Since) >= p.req.Lifetime
}

// strict leases the session's own proxy, on the exit IP the session took
// it with, or says why it cannot.
func (p *pick) strict(ctx context.Context) (Upstream, error) {
	own := p.route.Own
	lost := func(cause string) (Upstream, error) {
		return Upstream{}, &SessionLostError{Session: p.req.Session, Proxy: own, IP: p.route.IP, Cause: cause}
	}
	if p.expired() {
		return lost(SessionEnded)
	}
	switch exists, serving, healthy := p.t.s.opts.View.state(own); {
	case !exists || !serving:
		return lost(SessionProxyGone)
	case !healthy:
		return lost(SessionProxyUnhealthy)
	}
	if slices.Contains(p.avoid, own) {
		return lost(SessionProxyFailed)
	}
	if !p.usable(own) {
		return lost(SessionProxyGone) // no longer one the session's selector and tenant may use
	}
	if info, ok := p.t.s.opts.View.lookup(own, 0); ok && p.route.IP != "" && info.ExitIP != p.route.IP {
		return lost(SessionIPChanged)
	}
	hold, err := p.keepHold(ctx, own)
	if err != nil {
		var none *lease.NoProxyAvailableError
		if errors.As(err, &none) {
			return lost(SessionTaken)
		}
		return Upstream{}, err
	}
	granted, err := p.acquire(ctx, lease.Candidates{IDs: []string{own}}, p.req.MaxWait, false, hold)
	var none *lease.NoProxyAvailableError
	switch {
	case errors.As(err, &none) && none.Cause == lease.CauseCooling:
		return lost(SessionCooling)
	case errors.As(err, &none) && none.Cause == lease.CauseExclusive:
		return lost(SessionTaken)
	}
	notePaced(err, granted.Wait)
	if err != nil {
		return Upstream{}, err
	}
	up, err := p.upstream(ctx, granted, hold)
	if err != nil {
		return lost(SessionProxyGone)
	}
	p.note(ctx, lease.RouteSet{Proxy: own, Own: true, IP: p.route.IP, Hold: hold})
	return up, nil
}

// keepHold renews the session's exclusive hold on proxy, or takes it anew
// when it ran out and nobody else took the proxy; "" for a session that
// holds nothing.
func (p *pick) keepHold(ctx context.Context, proxy string) (string, error) {
	if !p.req.Exclusive {
		return "", nil
	}
	if p.route.Hold != "" {
		if _, err := p.t.s.store.Renew(ctx, p.route.Hold, p.req.SessionIdle); err == nil {
			return p.route.Hold, nil
		} else if !errors.Is(err, lease.ErrLeaseNotFound) {
			return "", err
		}
	}
	l, err := p.acquire(ctx, lease.Candidates{IDs: []string{proxy}}, 0, true, "")
	if err != nil {
		return "", err
	}
	p.route.Hold = l.ID
	return l.ID, nil
}

// soft leases the session's own proxy while it may take the host, else
// the host's detour, else a new one (which becomes the session's own when
// its own is gone); a strict session's first tunnel comes here too.
func (p *pick) soft(ctx context.Context) (Upstream, error) {
	route := p.route
	fresh := p.expired()
	ownUsable := p.usable(route.Own) && !fresh
	if fresh {
		p.releaseHold(ctx)
	}
	// skipped are the session's own proxy and detour when their pace or a
	// cooldown held them back: stickiness yields to politeness, but when
	// no other proxy may take the host either, the tunnel waits for them
	// as any paced tunnel would (or is told when to come back).
	var skipped []string
	// Each pass either leases or rules one proxy out (cooling down for the
	// host, or its credentials unreadable): a few passes, then the tunnel
	// fails.
	for range 5 {
		var (
			granted lease.Lease
			err     error
			own     bool
			hold    string
		)
		switch {
		case ownUsable && !slices.Contains(p.avoid, route.Own):
			// A session keeps its own proxy only while its pace allows a
			// request now: politeness beats stickiness.
			if hold, err = p.keepHold(ctx, route.Own); err == nil {
				granted, err = p.acquire(ctx, lease.Candidates{IDs: []string{route.Own}}, 0, false, hold)
			}
			own = true
			if errors.Is(err, lease.ErrNoProxyAvailable) {
				p.avoid, skipped = append(p.avoid, route.Own), append(skipped, route.Own) // for this host only
				continue
			}
		case p.usable(route.Detour):
			granted, err = p.acquire(ctx, lease.Candidates{IDs: []string{route.Detour}}, 0, false, "")
			if errors.Is(err, lease.ErrNoProxyAvailable) {
				p.avoid, skipped = append(p.avoid, route.Detour), append(skipped, route.Detour)
				continue
			}
		default:
			own = !ownUsable
			granted, hold, err = p.fresh(ctx, without(p.candidates, p.avoid), own)
			if errors.Is(err, lease.ErrNoProxyAvailable) && len(skipped) > 0 {
				slices.Sort(skipped)
				within := ""
				if slices.Contains(skipped, route.Own) {
					within = route.Hold
				}
				granted, err = p.acquire(ctx, lease.Candidates{IDs: skipped}, p.req.MaxWait, false, within)
				own = err == nil && granted.ProxyID == route.Own
				if own {
					hold = route.Hold
				}
				skipped = nil
			}
			notePaced(err, granted.Wait)
		}
		if err != nil {
			return Upstream{}, err
		}
		up, err := p.upstream(ctx, granted, hold)
		if err != nil {
			warn(logf.FromContext(ctx), "gateway: skipping an upstream", "proxy", granted.ProxyID, "error", err.Error())
			p.avoid = append(p.avoid, granted.ProxyID)
			continue
		}
		if p.req.Session != "" {
			set := lease.RouteSet{Proxy: granted.ProxyID, Own: own, Fresh: own && fresh, IP: up.ExitIP, Hold: hold}
			if own && granted.ProxyID == route.Own && !fresh {
				set.IP = route.IP
			}
			up.Fresh = own && (fresh || granted.ProxyID != route.Own)
			p.note(ctx, set)
		}
		return up, nil
	}
	return Upstream{}, &lease.NoProxyAvailableError{}
}

// fresh leases a proxy from c for a tunnel that goes elsewhere than the
// session's own: for an exclusive session taking a new own proxy, a proxy
// nobody holds a lease on, held for the session first.
func (p *pick) fresh(ctx context.Context, c lease.Candidates, own bool) (lease.Lease, string, error) {
	if !own || !p.req.Exclusive {
		l, err := p.acquire(ctx, c, p.req.MaxWait, false, "")
		return l, "", err
	}
	// The hold is taken for no host (it outlives this tunnel, and must not
	// count as a connection to it): a held proxy that may not take this
	// host now is let go, and the next one tried.
	var tried []string
	err := error(&lease.NoProxyAvailableError{})
	for range freshHoldTries {
		var hold, l lease.Lease
		if hold, err = p.acquire(ctx, without(c, tried), 0, true, ""); err != nil {
			return lease.Lease{}, "", err
		}
		l, err = p.acquire(ctx, lease.Candidates{IDs: []string{hold.ProxyID}}, p.req.MaxWait, false, hold.ID)
		if err == nil {
			p.releaseHold(ctx)
			return l, hold.ID, nil
		}
		_ = p.t.s.store.Release(ctx, hold.ID)
		if !errors.Is(err, lease.ErrNoProxyAvailable) {
			return lease.Lease{}, "", err
		}
		tried = append(tried, hold.ProxyID)
	}
	return lease.Lease{}, "", err
}

// freshHoldTries bounds the proxies an exclusive session holds and lets go
// in one pick because its host may not go through them now.
const freshHoldTries = 3

// releaseHold lets go of the session's exclusive hold on its old proxy.
func (p *pick) releaseHold(ctx context.Context) {
	if p.route.Hold == "" {
		return
	}
	if err := p.t.s.store.Release(ctx, p.route.Hold); err != nil {
		warn(logf.FromContext(ctx), "gateway: releasing a session's exclusive hold failed; it expires by itself", "session", p.req.Session, "error", err.Error())
	}
	p.route.Hold = ""
}

// upstream is where lease's proxy is, recorded in the ledger; a lease
// whose proxy cannot be reached so is released unused.
func (p *pick) upstream(ctx context.Context, granted lease.Lease, hold string) (Upstream, error) {
	up, err := p.t.upstream(ctx, granted)
	up.Wait, up.Paced, up.Hold = granted.Wait, granted.Paced, hold
	if err != nil {
		_ = p.t.s.store.Release(ctx, granted.ID) // never used, so never recorded
		return Upstream{}, err
	}
	up.LedgerUntil = p.t.s.opts.Clock.Now().Add(TunnelLedgerHorizon)
	p.t.s.record(ctx, lease.LedgerTunnel, lease.LedgerStart, granted, p.req.Session, up.LedgerUntil, 0)
	return up, nil
}

// note records the session's route after a tunnel; a store that does not
// answer only costs the next tunnel its stickiness, so it is logged.
func (p *pick) note(ctx context.Context, set lease.RouteSet) {
	if p.req.Session == "" {
		return
	}
	set.Idle = p.req.SessionIdle
	if err := p.t.s.store.SetRoute(ctx, p.session, p.host, set); err != nil {
		warn(logf.FromContext(ctx), "gateway: the session's route was not recorded; its next tunnel may go elsewhere",
			"session", p.req.Session, "error", err.Error())
	}
}

// PushBack tells discovery that host answered a request through the
// gateway with a push-back (429 or 503) and retryAfter: its learned pace
// slows, when pacing is adaptive.
func (t *Tunnels) PushBack(ctx context.Context, host string, retryAfter time.Duration) {
	t.s.pushBack(ctx, normalizeTarget(host), retryAfter)
}

// Refused records, in the outcome memory, that host refused proxy a
// request of who's through the gateway: the site's own plain-HTTP 403
// blocks it, its 429 (limited) pushes back. who is the block's reporter:
// the site may be one who runs, so it weighs as who's report would.
// A store that does not answer loses the outcome, and says so in the log.
func (t *Tunnels) Refused(ctx context.Context, who *tenant.Tenant, proxy, host string, limited bool) {
	host = normalizeTarget(host)
	if who == nil {
		who = tenant.Anonymous
	}
	if err := t.s.store.RecordOutcome(ctx, proxy, host, lease.Outcome{Blocked: true, Limited: limited, Source: lease.OutcomeGateway, Reporter: who.Name}); err != nil {
		logf.FromContext(ctx).Error(err, "recording a blocked outcome", "proxy", proxy, "host", host)
	}
}

// upstream is where a leased proxy is, with its credentials.
func (t *Tunnels) upstream(ctx context.Context, granted lease.Lease) (Upstream, error) {
	info, ok := t.s.opts.View.lookup(granted.ProxyID, 0)
	if !ok || info.IP == "" || info.Port == 0 {
		return Upstream{}, fmt.Errorf("proxy %s has no address", granted.ProxyID)
	}
	up := Upstream{ProxyID: granted.ProxyID, LeaseID: granted.ID, Address: net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port))), ExitIP: info.ExitIP}
	if info.hasCreds {
		if t.s.opts.Credentials == nil {
			return Upstream{}, errors.New("its credentials cannot be read")
		}
		c, err := t.s.opts.Credentials.Lookup(ctx, info.creds)
		if err == nil {
			// The gateway's own credentials for its own lease: they never
			// leave the operator.
			c, err = c.SignedFor(granted.ProxyID, granted.ID, granted.ExpiresAt)
		}
		if err != nil {
			return Upstream{}, fmt.Errorf("reading its credentials: %w", err)
		}
		up.User = c.Userinfo()
	}
	return up, nil
}

// without returns candidates less the ids in drop, with no index when any
// was dropped (a store indexes the view's own sets only).
func without(c lease.Candidates, drop []string) lease.Candidates {
	if !slices.ContainsFunc(drop, func(id string) bool { _, found := slices.BinarySearch(c.IDs, id); return found }) {
		return c
	}
	ids := make([]string, 0, len(c.IDs))
	for _, id := range c.IDs {
		if !slices.Contains(drop, id) {
			ids = append(ids, id)
		}
	}
	return lease.Candidates{IDs: ids}
}

// TunnelLedgerHorizon is how far past each of a tunnel's ledger records
// the record says it may hold its IP: the gateway renews a tunnel's lease
// every third of its TTL, but writes a checkpoint only when the horizon
// would otherwise run out, and an end record when the tunnel ends. So the
// ledger grows with tunnels, not with their renewals (a tunnel shorter
// than the horizon has two records), and an answer is exact for every
// tunnel that ended; one whose replica died without its end record is
// attributed at most the horizon past its last record.
const TunnelLedgerHorizon = 15 * time.Minute

// Renew extends a tunnel's lease (or its session's exclusive hold) while
// the tunnel lasts. recorded is how far its ledger records say it holds
// its IP (Upstream.LedgerUntil, or what the last Renew returned): when the
// lease could outlast it, a checkpoint record extends it by
// TunnelLedgerHorizon. It returns the horizon as it now is; a hold (zero
// recorded) has no records of its own, the tunnels within it do.
func (t *Tunnels) Renew(ctx context.Context, leaseID, session string, ttl time.Duration, recorded time.Time) (time.Time, error) {
	granted, err := t.s.store.Renew(ctx, leaseID, ttl)
	if err != nil || recorded.IsZero() || granted.ExpiresAt.Before(recorded) {
		return recorded, err
	}
	until := t.s.opts.Clock.Now().Add(TunnelLedgerHorizon)
	t.s.record(ctx, lease.LedgerTunnel, lease.LedgerRenew, granted, session, until, 0)
	return until, nil
}

// Release ends a tunnel's lease, recording the bytes it carried in the
// ledger (the gateway counts them toward its tenant's quota itself,
// CountBytes); failures are logged (the lease expires by itself).
func (t *Tunnels) Release(ctx context.Context, leaseID, session string, bytes int64) {
	granted, err := t.s.store.Get(ctx, leaseID)
	if err == nil {
		err = t.s.store.Release(ctx, leaseID)
	}
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		return
	case err != nil:
		warn(logf.FromContext(ctx), "gateway: releasing a tunnel's lease failed; it expires by itself", "lease", leaseID, "error", err.Error())
		return
	}
	t.s.record(ctx, lease.LedgerTunnel, lease.LedgerEnd, granted, session, t.s.opts.Clock.Now(), bytes)
}

// SessionReport is a client's report on a gateway session's requests to a
// target, as the API took it.
type SessionReport struct {
	Session, Target, Result string
	// Proxy is the one the session's requests to Target went through.
	Proxy string
}

// sessionListeners hear of every session report this replica takes.
type sessionListeners struct {
	mu  sync.Mutex
	fns []func(SessionReport)
}

// OnSessionReport calls fn with every session report this replica's API
// takes: the gateway closes the session's open tunnels to a rate-limited
// host, so its next request goes elsewhere at once.
func (s *Server) OnSessionReport(fn func(SessionReport)) {
	s.listeners.mu.Lock()
	defer s.listeners.mu.Unlock()
	s.listeners.fns = append(s.listeners.fns, fn)
}

func (l *sessionListeners) notify(r SessionReport) {
	l.mu.Lock()
	fns := slices.Clone(l.fns)
	l.mu.Unlock()
	for _, fn := range fns {
		fn(r)
	}
}

// NormalizeTarget is a target host as the store keys cooldowns and routes:
// lower case, without port, brackets or a trailing dot.
func NormalizeTarget(target string) string { return normalizeTarget(target) }
