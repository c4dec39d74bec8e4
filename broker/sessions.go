package broker

import (
	"context"
	"errors"
	"slices"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// A tunnel's choice of upstream: the session's own proxy, its detour for
// a host, or a new one, with strict sessions, lifetimes and exclusive
// holds.

// pick is one tunnel's choice of upstream.
type pick struct {
	b          *Broker
	req        TunnelRequest
	who        *tenant.Tenant
	host       string
	session    string
	candidates lease.Candidates
	avoid      []string
	route      lease.Route
}

// acquire takes a lease for the tunnel from c; exclusive takes the
// session's hold instead, which outlives a tunnel: it lasts while the
// session does.
func (p *pick) acquire(ctx context.Context, c lease.Candidates, maxWait time.Duration, exclusive bool, within string) (lease.Lease, error) {
	a := acquisition{who: p.who, limit: LimitTunnels, candidates: c, target: p.host, ttl: p.req.TTL, maxWait: maxWait,
		exclusive: exclusive, within: within}
	if exclusive {
		a.hold, a.ttl = true, p.req.SessionIdle
	}
	return p.b.acquire(ctx, a)
}

func (p *pick) usable(id string) bool {
	_, found := slices.BinarySearch(p.candidates.IDs, id)
	return id != "" && found && !slices.Contains(p.avoid, id)
}

// expired says whether the session's stint on its own proxy is over.
func (p *pick) expired() bool {
	return p.req.Lifetime > 0 && p.route.Own != "" && !p.route.Since.IsZero() &&
		p.b.opts.Clock.Since(p.route.Since) >= p.req.Lifetime
}

// retired says why the session's stint on its own proxy met a limit of
// the request's (RetiredErrors, RetiredUses), or "" while it has not.
func (p *pick) retired() string {
	switch {
	case p.route.Own == "":
		return ""
	case p.req.MaxErrorScore > 0 && p.route.Score >= p.req.MaxErrorScore:
		return RetiredErrors
	case p.req.MaxUses > 0 && p.route.Uses >= p.req.MaxUses:
		return RetiredUses
	}
	return ""
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
	if why := p.retired(); why != "" {
		return Upstream{}, &SessionLostError{Session: p.req.Session, Proxy: own, IP: p.route.IP, Cause: SessionRetired, Retired: why}
	}
	switch exists, serving, healthy := p.b.opts.View.state(own); {
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
	if info, ok := p.b.opts.View.Lookup(own, 0); ok && p.route.IP != "" && info.ExitIP != p.route.IP {
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
		if _, err := p.b.store.Renew(ctx, p.route.Hold, p.req.SessionIdle); err == nil {
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
	retired := p.retired()
	fresh := p.expired() || retired != ""
	ownUsable := p.usable(route.Own) && !fresh
	if fresh {
		p.releaseHold(ctx)
	}
	// skipped are the session's own proxy and detour when their pace or a
	// cooldown held them back: stickiness yields to politeness, but when
	// no other proxy may take the host either, the tunnel waits for them
	// as any paced tunnel would (or is told when to come back).
	var skipped []string
	if retired != "" {
		// A retired stint's proxy is what the site grew tired of: the new
		// stint starts elsewhere when another may take the host, and on
		// the same proxy only when none may (not for an exclusive
		// session, whose hold on it is let go).
		p.avoid = append(p.avoid, route.Own)
		if route.Hold == "" {
			skipped = append(skipped, route.Own)
		}
	}
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
			operator.Warn(logf.FromContext(ctx), "gateway: skipping an upstream", "proxy", granted.ProxyID, "error", err.Error())
			p.avoid = append(p.avoid, granted.ProxyID)
			continue
		}
		if p.req.Session != "" {
			set := lease.RouteSet{Proxy: granted.ProxyID, Own: own, Fresh: own && fresh, IP: up.proxyExit, Hold: hold}
			if own && granted.ProxyID == route.Own && !fresh {
				set.IP = route.IP
			}
			up.Fresh = own && (fresh || granted.ProxyID != route.Own)
			if up.Fresh {
				up.Retired = retired
			} else if own {
				up.Score = route.Score
			}
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
		_ = p.b.store.Release(ctx, hold.ID)
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
	if err := p.b.store.Release(ctx, p.route.Hold); err != nil {
		operator.Warn(logf.FromContext(ctx), "gateway: releasing a session's exclusive hold failed; it expires by itself", "session", p.req.Session, "error", err.Error())
	}
	p.route.Hold = ""
}

// upstream is where lease's proxy is, recorded in the ledger; a lease
// whose proxy cannot be reached so is released unused.
func (p *pick) upstream(ctx context.Context, granted lease.Lease, hold string) (Upstream, error) {
	session := ""
	if p.req.Session != "" {
		session = p.session
	}
	up, err := p.b.upstream(ctx, granted, session)
	up.Wait, up.Paced, up.Hold = granted.Wait, granted.Paced, hold
	if err != nil {
		_ = p.b.store.Release(ctx, granted.ID) // never used, so never recorded
		return Upstream{}, err
	}
	up.LedgerUntil, up.Session = p.b.opts.Clock.Now().Add(TunnelLedgerHorizon), p.session
	p.b.record(ctx, lease.LedgerTunnel, lease.LedgerStart, granted, p.req.Session, up.LedgerUntil, 0)
	return up, nil
}

// note records the session's route after a tunnel; a store that does not
// answer only costs the next tunnel its stickiness, so it is logged.
func (p *pick) note(ctx context.Context, set lease.RouteSet) {
	if p.req.Session == "" {
		return
	}
	set.Idle = p.req.SessionIdle
	if err := p.b.store.SetRoute(ctx, p.session, p.host, set); err != nil {
		operator.Warn(logf.FromContext(ctx), "gateway: the session's route was not recorded; its next tunnel may go elsewhere",
			"session", p.req.Session, "error", err.Error())
	}
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
