package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// Errors of a gateway client's tunnel: who it is (the discovery API's
// Authorize answers the first two), and what it asked.
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

// LockedRetryAfter is the Retry-After of the API's and the gateway's 503
// while locked (ErrGatewayLocked): a configuration change, not a moment's
// load.
const LockedRetryAfter = 60 * time.Second

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
	// MaxErrorScore retires a session's stint once its error score (what
	// its requests' blocks and push-backs added, less what its successes
	// took away) reaches it; MaxUses once it has carried that many
	// tunnels. Zero: no limit. A soft session then starts a new stint on
	// another proxy; a strict one ends.
	MaxErrorScore float64
	MaxUses       int64
}

// Upstream is the proxy one tunnel goes through, on a lease of its own.
type Upstream struct {
	ProxyID string
	// Address is the proxy's host:port; ExitIP where sites see the
	// tunnel come from (a dual-stack proxy's address of its IPv6 range,
	// for a site reached over IPv6).
	Address, ExitIP string
	// proxyExit is the proxy's exit IP (View's), which a session's route
	// remembers to tell a proxy that moved.
	proxyExit string
	// SessionAddress, for a proxy that leaves from several addresses of
	// its IPv6 range, is the one the tunnel's session leaves from: the
	// netid.SessionHeader value to send it ("": none, the proxy's own).
	SessionAddress string
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
	// IP (TunnelLedgerHorizon): the gateway hands it to RenewTunnel.
	LedgerUntil time.Time
	// Session is the session's key (SessionKey: the tenant's own
	// namespace of session names; "" rotates), as session reports name it.
	Session string
	// Retired says why the session's last stint was retired, when this
	// tunnel starts its new one (RetiredErrors, RetiredUses; "" none).
	Retired string
	// Score is the error score of the session's stint as this tunnel
	// began (0 for a new stint or no session).
	Score float64
	// BannedClient is the TLS fingerprint of the session's client (the
	// tenant's last, for a rotating tunnel) when the host bans it through
	// every proxy (a lease.ClientBan): a new IP will not help, another
	// client will. "": none known.
	BannedClient string
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
	// SessionRetired: its stint met a limit (RetiredErrors, RetiredUses).
	SessionRetired = "retired"
)

// Why a session's stint was retired (Upstream.Retired,
// SessionLostError.Retired).
const (
	// RetiredErrors: its error score reached TunnelRequest.MaxErrorScore.
	RetiredErrors = "error_score"
	// RetiredUses: it carried TunnelRequest.MaxUses tunnels.
	RetiredUses = "max_uses"
)

// What each answer adds to a session's error score, as Crawlee's
// SessionPool weighs them: a block counts one, a push-back half, and a
// success takes half away; DefaultMaxErrorScore retires the stint.
const (
	ScoreBlocked         = 1.0
	ScoreRateLimited     = 0.5
	ScoreOK              = -0.5
	DefaultMaxErrorScore = 3.0
)

// ScoreOf is what a report or answer of result adds to a session's error
// score (0 for a result that says nothing of the site's view).
func ScoreOf(result string) float64 {
	switch result {
	case lease.ResultBlocked:
		return ScoreBlocked
	case lease.ResultRateLimited:
		return ScoreRateLimited
	case lease.ResultOK:
		return ScoreOK
	}
	return 0
}

// SessionLostError says a strict session cannot go on: its tunnels would
// leave from another exit IP. The client starts a new session.
type SessionLostError struct {
	Session, Proxy, IP string
	// Cause is one of the Session* causes above; Retired, for
	// SessionRetired, says which limit (RetiredErrors, RetiredUses).
	Cause, Retired string
}

func (e *SessionLostError) Error() string {
	if e.Cause == SessionRetired {
		return fmt.Sprintf("strict session %q was retired from proxy %s (%s): %s; start a new session", e.Session, e.Proxy, e.IP, retiredWhy(e.Retired))
	}
	if e.Cause == SessionEnded {
		return fmt.Sprintf("strict session %q ended: its lifetime on proxy %s (%s) is over; start a new session", e.Session, e.Proxy, e.IP)
	}
	return fmt.Sprintf("strict session %q lost its proxy %s (%s): %s; start a new session", e.Session, e.Proxy, e.IP, strings.ReplaceAll(e.Cause, "_", " "))
}

// Tunnel leases the upstream for a tunnel: the session's own proxy while it
// is healthy and not cooling down for the host; else the proxy the session
// last took to that host instead, if it still may; else the least-loaded
// healthy one not cooling down for the host. The session moves to that
// last one only when its own proxy is gone, unhealthy or failed this
// tunnel, or its lifetime there is over; a cooldown for one host leaves it
// where it is for the others. A strict session never moves: it fails with
// a *SessionLostError. With nothing available it returns a
// *NoProxyAvailableError.
func (b *Broker) Tunnel(ctx context.Context, req TunnelRequest) (Upstream, error) {
	if req.Session != "" && !ValidSessionName(req.Session) {
		return Upstream{}, fmt.Errorf("%w: session %q must be 1-64 letters, digits, '-' or '_'", ErrInvalidTunnel, req.Session)
	}
	if req.Session == "" && (req.Strict || req.Exclusive || req.Lifetime > 0 || req.MaxUses > 0) {
		return Upstream{}, fmt.Errorf("%w: strict, exclusive, a lifetime and a usage cap need a session", ErrInvalidTunnel)
	}
	if err := ValidateSelector("selector", req.Selector); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	host := NormalizeTarget(req.Host)
	if err := ValidateTarget(host, true); err != nil {
		return Upstream{}, fmt.Errorf("%w: %w", ErrInvalidTunnel, err)
	}
	who := req.Tenant
	if who == nil {
		who = tenant.Anonymous
	}
	candidates, err := b.candidates(ctx, who, req.Selector)
	if err != nil {
		return Upstream{}, err
	}
	p := &pick{b: b, req: req, who: who, host: host, session: SessionKey(who, req.Session), candidates: candidates,
		avoid: slices.Clone(req.Avoid)}
	if req.Session != "" {
		if p.route, err = b.store.Route(ctx, p.session, host); err != nil {
			return Upstream{}, err
		}
	}
	var up Upstream
	if req.Strict && p.route.Own != "" && !req.Restart {
		up, err = p.strict(ctx)
	} else {
		up, err = p.soft(ctx)
	}
	if err == nil {
		up.BannedClient = b.bannedClient(ctx, who, p.session, host)
	}
	return up, err
}

// retiredWhy says why a stint was retired, for a person.
func retiredWhy(why string) string {
	switch why {
	case RetiredErrors:
		return "its requests were refused too often (its error score reached the limit)"
	case RetiredUses:
		return "it carried as many tunnels as its usage cap allows"
	}
	return why
}

// MarkSession adds what result says of the site's view (ScoreOf) to the
// error score of who's session's stint on proxy, for an answer the
// gateway saw itself (plain HTTP, or an inspected tunnel). A store that
// does not answer loses the mark, and says so in the log.
func (b *Broker) MarkSession(ctx context.Context, session, proxy, result string) {
	delta := ScoreOf(result)
	if session == "" || delta == 0 {
		return
	}
	if _, err := b.store.MarkSession(ctx, session, proxy, delta); err != nil && !errors.Is(err, lease.ErrSessionNotFound) {
		operator.Warn(logf.FromContext(ctx), "gateway: a session's error score was not updated", "session", session, "error", err.Error())
	}
}

// Turn takes the slot of a request inside a tunnel through proxy to host
// (a kept-alive connection's next request): the pace a lease for it would
// keep, with no new lease, on the same slots. wait is how long to hold the
// request; a pace with no slot within maxWait is a
// *lease.NoProxyAvailableError (CausePaced).
func (b *Broker) Turn(ctx context.Context, proxy, host string, maxWait time.Duration) (time.Duration, error) {
	host = NormalizeTarget(host)
	var p lease.Pace
	if paceOf := b.paceOf(ctx, host); paceOf != nil {
		p = paceOf(proxy)
	}
	adaptive := b.opts.Politeness.Adaptive && host != ""
	if p.IsZero() && !adaptive {
		return 0, nil
	}
	wait, err := b.store.Slot(ctx, proxy, host, p, adaptive, maxWait)
	notePaced(err, wait)
	return wait, err
}

// PushBack tells the broker that host answered a request through the
// gateway with a push-back (429 or 503) and retryAfter: its learned pace
// slows, when pacing is adaptive.
func (b *Broker) PushBack(ctx context.Context, host string, retryAfter time.Duration) {
	b.pushBack(ctx, NormalizeTarget(host), retryAfter)
}

// Refused records, in the outcome memory, that host refused proxy a
// request of who's through the gateway (a plain-HTTP or inspected one): the
// site's own 403 or block page blocks it, its 429 (limited) pushes back,
// and its Retry-After, when it gave one, keeps the proxy away from the
// host that long for every tenant (at most the default cooldown). who is
// the block's reporter: the site may be one who runs, so it weighs as
// who's report would. A store that does not answer loses the outcome, and
// says so in the log.
func (b *Broker) Refused(ctx context.Context, who *tenant.Tenant, proxy, host string, limited bool, retryAfter time.Duration) {
	host = NormalizeTarget(host)
	if who == nil {
		who = tenant.Anonymous
	}
	o := lease.Outcome{Blocked: true, Limited: limited, Source: lease.OutcomeGateway, Reporter: who.Name, Cooldown: min(max(retryAfter, 0), b.opts.DefaultCooldown)}
	if err := b.store.RecordOutcome(ctx, proxy, host, o); err != nil {
		logf.FromContext(ctx).Error(err, "recording a blocked outcome", "proxy", proxy, "host", host)
	} else {
		b.refusedSender(ctx, proxy, host, o)
	}
	result := lease.ResultBlocked
	if limited {
		result = lease.ResultRateLimited
	}
	b.countRefusal(ctx, who.Name, host, proxy, result)
}

// upstream is where a leased proxy is, with its credentials, and the
// address session (its key; "" rotates) leaves from when the proxy has
// session addresses.
func (b *Broker) upstream(ctx context.Context, granted lease.Lease, session string) (Upstream, error) {
	info, ok := b.opts.View.Lookup(granted.ProxyID, 0)
	if !ok || info.IP == "" || info.Port == 0 {
		return Upstream{}, fmt.Errorf("proxy %s has no address", granted.ProxyID)
	}
	up := Upstream{ProxyID: granted.ProxyID, LeaseID: granted.ID, Address: net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port))), ExitIP: info.ExitIP,
		proxyExit: info.ExitIP}
	index := -1
	if info.SessionAddresses > 0 && session != "" {
		index = netid.SessionIndex(session, int(info.SessionAddresses))
		up.SessionAddress = strconv.Itoa(index)
	}
	if info.IPv6Prefix != "" && b.families.overIPv6(ctx, granted.Target) {
		up.ExitIP = exitOverIPv6(info.IPv6Prefix, index)
	}
	if info.hasCreds {
		// The gateway's own credentials for its own lease: they never
		// leave the operator.
		c, err := b.credentialsFor(ctx, info, &granted)
		if err != nil {
			return Upstream{}, err
		}
		up.User = c.Userinfo()
	}
	return up, nil
}

// exitOverIPv6 is where a dual-stack proxy's tunnel leaves from to a site
// reached over IPv6: its session's address of the proxy's range (index),
// or the range's own address (index -1: no session address).
func exitOverIPv6(prefix string, index int) string {
	if p, err := netip.ParsePrefix(prefix); err == nil && index >= 0 {
		if a, err := netid.SessionAddress(p, index); err == nil {
			return a.String()
		}
	}
	return netid.RangeAddr(prefix)
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

// RenewTunnel extends a tunnel's lease (or its session's exclusive hold) while
// the tunnel lasts. recorded is how far its ledger records say it holds
// its IP (Upstream.LedgerUntil, or what the last RenewTunnel returned): when the
// lease could outlast it, a checkpoint record extends it by
// TunnelLedgerHorizon. It returns the horizon as it now is; a hold (zero
// recorded) has no records of its own, the tunnels within it do.
func (b *Broker) RenewTunnel(ctx context.Context, leaseID, session string, ttl time.Duration, recorded time.Time) (time.Time, error) {
	granted, err := b.store.Renew(ctx, leaseID, ttl)
	if err != nil || recorded.IsZero() || granted.ExpiresAt.Before(recorded) {
		return recorded, err
	}
	until := b.opts.Clock.Now().Add(TunnelLedgerHorizon)
	b.record(ctx, lease.LedgerTunnel, lease.LedgerRenew, granted, session, until, 0)
	return until, nil
}

// ReleaseTunnel ends a tunnel's lease, recording what it carried in the
// ledger and the tenant's usage (the gateway counts its bytes toward its
// tenant's quota itself, CountBytes); failures are logged (the lease
// expires by itself).
func (b *Broker) ReleaseTunnel(ctx context.Context, leaseID, session string, carried Carried) {
	granted, err := b.store.Get(ctx, leaseID)
	if err == nil {
		err = b.store.Release(ctx, leaseID)
	}
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		return
	case err != nil:
		operator.Warn(logf.FromContext(ctx), "gateway: releasing a tunnel's lease failed; it expires by itself", "lease", leaseID, "error", err.Error())
		return
	}
	now := b.opts.Clock.Now()
	b.record(ctx, lease.LedgerTunnel, lease.LedgerEnd, granted, session, now, carried.Up+carried.Down)
	served := int64(0)
	if carried.Up+carried.Down > 0 || carried.Requests > 0 {
		served = 1 // one that failed before carrying anything is no tunnel of the tenant's
	}
	b.countUsage(ctx, granted.Holder, granted.Target, granted.ProxyID, lease.UsageCounts{Tunnels: served, Requests: carried.Requests,
		BytesUp: carried.Up, BytesDown: carried.Down, ProxyMillis: now.Sub(granted.CreatedAt).Milliseconds()})
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
func (b *Broker) OnSessionReport(fn func(SessionReport)) {
	b.listeners.mu.Lock()
	defer b.listeners.mu.Unlock()
	b.listeners.fns = append(b.listeners.fns, fn)
}

func (l *sessionListeners) notify(r SessionReport) {
	l.mu.Lock()
	fns := slices.Clone(l.fns)
	l.mu.Unlock()
	for _, fn := range fns {
		fn(r)
	}
}
