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
	"sync"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/tenant"
)

// Errors of the gateway's side of discovery.
var (
	// ErrGatewayLocked: the discovery API runs unauthenticated
	// (--discovery-auth=none) or its token Secret is missing, so the
	// gateway refuses everyone: without a token it would be an open proxy.
	ErrGatewayLocked = errors.New("the gateway needs the discovery token: run the operator with --discovery-auth=required and the token Secret in place (see docs/security.md)")
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
	if !required || (token == "" && t.s.opts.Tenants == nil) {
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
	// Selector restricts the upstreams, as a lease's does.
	Selector Selector
	// Host is the tunnel's target host (a port is ignored).
	Host string
	// Avoid are proxies that already failed this tunnel.
	Avoid []string
	// TTL is the tunnel lease's; the gateway renews it while the tunnel
	// lasts. SessionIdle is how long a session's route outlives its last
	// tunnel.
	TTL, SessionIdle time.Duration
	// MaxWait is how long the tunnel may wait for a paced host's next
	// slot.
	MaxWait time.Duration
}

// Upstream is the proxy one tunnel goes through, on a lease of its own.
type Upstream struct {
	ProxyID string
	// Address is the proxy's host:port.
	Address string
	// User are the proxy's credentials (nil: it needs none).
	User    *url.Userinfo
	LeaseID string
	// Wait is how long the tunnel must wait before it goes: the slot its
	// host's pace reserved.
	Wait time.Duration
	// Paced says whether a pace or concurrency limit applies to the
	// tunnel's host: the gateway then bounds the tunnel's lifetime.
	Paced bool
}

// Pick leases the upstream for a tunnel: the session's own proxy while it
// is healthy and not cooling down for the host; else the proxy the session
// last took to that host instead, if it still may; else the least-loaded
// healthy one not cooling down for the host. The session moves to that
// last one only when its own proxy is gone, unhealthy or failed this
// tunnel; a cooldown for one host leaves it where it is for the others.
// With nothing available it returns a *NoProxyAvailableError.
func (t *Tunnels) Pick(ctx context.Context, req TunnelRequest) (Upstream, error) {
	if req.Session != "" && !ValidSessionName(req.Session) {
		return Upstream{}, fmt.Errorf("%w: session %q must be 1-64 letters, digits, '-' or '_'", ErrInvalidTunnel, req.Session)
	}
	if err := validateSelector("selector", req.Selector); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	host := normalizeTarget(req.Host)
	if err := validateTarget(host, true); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	store := t.s.store
	who := req.Tenant
	if who == nil {
		who = tenant.Anonymous
	}
	session := SessionKey(who, req.Session)
	candidates, err := t.s.leasableCandidates(ctx, who, t.s.opts.View.candidates(req.Selector))
	if err != nil {
		return Upstream{}, err
	}
	limit := t.s.limitFor(who, LimitTunnels)
	acquire := func(c Candidates, maxWait time.Duration) (Lease, error) {
		r := t.s.acquireRequest(c, host, req.TTL, maxWait)
		r.Holder, r.Limit = who.Name, limit
		l, err := store.Acquire(ctx, r)
		return l, t.s.quotaError(who, LimitTunnels, err)
	}
	avoid := slices.Clone(req.Avoid)
	usable := func(id string) bool {
		_, found := slices.BinarySearch(candidates.IDs, id)
		return id != "" && found && !slices.Contains(avoid, id)
	}
	var route Route
	if req.Session != "" {
		if route, err = store.Route(ctx, session, host); err != nil {
			return Upstream{}, err
		}
	}
	ownUsable := usable(route.Own)
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
			lease Lease
			err   error
			own   bool
		)
		switch {
		case ownUsable && !slices.Contains(avoid, route.Own):
			// A session keeps its own proxy only while its pace allows a
			// request now: politeness beats stickiness.
			lease, err = acquire(Candidates{IDs: []string{route.Own}}, 0)
			own = true
			if errors.Is(err, ErrNoProxyAvailable) {
				avoid, skipped = append(avoid, route.Own), append(skipped, route.Own) // for this host only
				continue
			}
		case usable(route.Detour):
			lease, err = acquire(Candidates{IDs: []string{route.Detour}}, 0)
			if errors.Is(err, ErrNoProxyAvailable) {
				avoid, skipped = append(avoid, route.Detour), append(skipped, route.Detour)
				continue
			}
		default:
			lease, err = acquire(without(candidates, avoid), req.MaxWait)
			own = !ownUsable
			if errors.Is(err, ErrNoProxyAvailable) && len(skipped) > 0 {
				slices.Sort(skipped)
				lease, err = acquire(Candidates{IDs: skipped}, req.MaxWait)
				own = err == nil && lease.ProxyID == route.Own
				skipped = nil
			}
			notePaced(err, lease.Wait)
		}
		if err != nil {
			return Upstream{}, err
		}
		up, err := t.upstream(ctx, lease)
		up.Wait, up.Paced = lease.Wait, lease.Paced
		if err != nil {
			warn(logf.FromContext(ctx), "gateway: skipping an upstream", "proxy", lease.ProxyID, "error", err.Error())
			_ = store.Release(ctx, lease.ID) // never used, so never recorded
			avoid = append(avoid, lease.ProxyID)
			continue
		}
		t.s.record(ctx, LedgerTunnel, LedgerStart, lease, req.Session, lease.ExpiresAt, 0)
		if req.Session != "" {
			if err := store.SetRoute(ctx, session, host, lease.ProxyID, own, req.SessionIdle); err != nil {
				warn(logf.FromContext(ctx), "gateway: the session's route was not recorded; its next tunnel may go elsewhere",
					"session", req.Session, "error", err.Error())
			}
		}
		return up, nil
	}
	return Upstream{}, &NoProxyAvailableError{}
}

// PushBack tells discovery that host answered a request through the
// gateway with a push-back (429 or 503) and retryAfter: its learned pace
// slows, when pacing is adaptive.
func (t *Tunnels) PushBack(ctx context.Context, host string, retryAfter time.Duration) {
	t.s.pushBack(ctx, normalizeTarget(host), retryAfter)
}

// Refused records that host refused proxy through the gateway in the
// outcome memory: a refused tunnel or a plain-HTTP 403 blocks it, a
// plain-HTTP 429 (limited) pushes back. A store that does not answer
// loses the outcome, and says so in the log.
func (t *Tunnels) Refused(ctx context.Context, proxy, host string, limited bool) {
	host = normalizeTarget(host)
	if err := t.s.store.RecordOutcome(ctx, proxy, host, Outcome{Blocked: true, Limited: limited, Source: OutcomeGateway}); err != nil {
		logf.FromContext(ctx).Error(err, "recording a blocked outcome", "proxy", proxy, "host", host)
	}
}

// upstream is where a leased proxy is, with its credentials.
func (t *Tunnels) upstream(ctx context.Context, lease Lease) (Upstream, error) {
	info, ok := t.s.opts.View.lookup(lease.ProxyID, 0)
	if !ok || info.IP == "" || info.Port == 0 {
		return Upstream{}, fmt.Errorf("proxy %s has no address", lease.ProxyID)
	}
	up := Upstream{ProxyID: lease.ProxyID, LeaseID: lease.ID, Address: net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port)))}
	if info.hasCreds {
		if t.s.opts.Credentials == nil {
			return Upstream{}, errors.New("its credentials cannot be read")
		}
		c, err := t.s.opts.Credentials.Lookup(ctx, info.creds)
		if err == nil {
			// The gateway's own credentials for its own lease: they never
			// leave the operator.
			c, err = c.SignedFor(lease.ProxyID, lease.ID, lease.ExpiresAt)
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
func without(c Candidates, drop []string) Candidates {
	if !slices.ContainsFunc(drop, func(id string) bool { _, found := slices.BinarySearch(c.IDs, id); return found }) {
		return c
	}
	ids := make([]string, 0, len(c.IDs))
	for _, id := range c.IDs {
		if !slices.Contains(drop, id) {
			ids = append(ids, id)
		}
	}
	return Candidates{IDs: ids}
}

// Renew extends a tunnel's lease while the tunnel lasts.
func (t *Tunnels) Renew(ctx context.Context, leaseID, session string, ttl time.Duration) error {
	lease, err := t.s.store.Renew(ctx, leaseID, ttl)
	if err == nil {
		t.s.record(ctx, LedgerTunnel, LedgerRenew, lease, session, lease.ExpiresAt, 0)
	}
	return err
}

// Release ends a tunnel's lease, recording the bytes it carried in the
// ledger and toward its tenant's daily quota; failures are logged (the
// lease expires by itself).
func (t *Tunnels) Release(ctx context.Context, leaseID, session string, bytes int64) {
	lease, err := t.s.store.Get(ctx, leaseID)
	if err == nil {
		err = t.s.store.Release(ctx, leaseID)
	}
	switch {
	case errors.Is(err, ErrLeaseNotFound):
		return
	case err != nil:
		warn(logf.FromContext(ctx), "gateway: releasing a tunnel's lease failed; it expires by itself", "lease", leaseID, "error", err.Error())
		return
	}
	t.s.record(ctx, LedgerTunnel, LedgerEnd, lease, session, t.s.opts.Clock.Now(), bytes)
	t.countBytes(ctx, lease.Holder, bytes)
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
