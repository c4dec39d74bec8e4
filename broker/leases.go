package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// LeaseRequest is a lease the API asks for on a tenant's behalf.
type LeaseRequest struct {
	Selector Selector
	// Target is the host the client will crawl ("" for none).
	Target       string
	TTL, MaxWait time.Duration
	// Exclusive asks for a proxy nobody else holds, held alone.
	Exclusive bool
}

// RefusedError is Lease's answer when no proxy could be had: how many
// proxies who might have had (healthy, matching, leasable), and the
// store's answer (errors.As finds the *lease.NoProxyAvailableError).
type RefusedError struct {
	Candidates int
	Cause      *lease.NoProxyAvailableError
}

func (e *RefusedError) Error() string { return e.Cause.Error() }

// Unwrap is the store's answer.
func (e *RefusedError) Unwrap() error { return e.Cause }

// UnavailableError says a lease's proxy can no longer serve it (Why): the
// lease is not renewed.
type UnavailableError struct {
	Lease, Why string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("lease %q is not renewed: %s; release it and lease another", e.Lease, e.Why)
}

// Lease takes a lease for who: among the healthy proxies req.Selector
// matches that who may lease, under who's quota and the target's
// politeness, recorded in the ledger. A refusal for want of a proxy is a
// *RefusedError (and, unless politeness held it back, tells the pools the
// selector names, those who may lease, that they are short); a quota's is
// a *QuotaError; RBAC that could not answer is ErrTenantsUnavailable.
func (b *Broker) Lease(ctx context.Context, who *tenant.Tenant, req LeaseRequest) (lease.Lease, error) {
	target := NormalizeTarget(req.Target)
	candidates, err := b.candidates(ctx, who, req.Selector)
	if err != nil {
		return lease.Lease{}, err
	}
	granted, err := b.acquire(ctx, acquisition{who: who, limit: LimitLeases, candidates: candidates, target: target,
		ttl: req.TTL, maxWait: req.MaxWait, exclusive: req.Exclusive})
	notePaced(err, granted.Wait)
	var none *lease.NoProxyAvailableError
	if errors.As(err, &none) {
		if !none.Paced() {
			b.noteRefused(ctx, who, req.Selector)
		}
		return lease.Lease{}, &RefusedError{Candidates: len(candidates.IDs), Cause: none}
	}
	if err != nil {
		return lease.Lease{}, err
	}
	b.record(ctx, lease.LedgerLease, lease.LedgerStart, granted, "", granted.ExpiresAt, 0)
	// A lease's proxy time is what it holds: its TTL now, what a renewal
	// adds, less what a release gives back.
	b.countUsage(ctx, who.Name, target, granted.ProxyID, lease.UsageCounts{Leases: 1, ProxyMillis: granted.ExpiresAt.Sub(granted.CreatedAt).Milliseconds()})
	return granted, nil
}

// Renew extends who's lease id to now+ttl, recorded in the ledger; a lease
// whose proxy went away is not extended (an *UnavailableError): the client
// should lease another, and the lease lives on until its TTL so a report
// on it (a cooldown worth keeping) is still taken.
func (b *Broker) Renew(ctx context.Context, who *tenant.Tenant, id string, ttl time.Duration) (lease.Lease, error) {
	held, err := b.Get(ctx, who, id)
	if err != nil {
		return lease.Lease{}, err
	}
	if why := b.opts.View.Unavailable(held.ProxyID); why != "" {
		return lease.Lease{}, &UnavailableError{Lease: id, Why: why}
	}
	renewed, err := b.store.Renew(ctx, id, ttl)
	if err != nil {
		return lease.Lease{}, err
	}
	b.record(ctx, lease.LedgerLease, lease.LedgerRenew, renewed, "", renewed.ExpiresAt, 0)
	if added := renewed.ExpiresAt.Sub(held.ExpiresAt); added > 0 {
		b.countUsage(ctx, held.Holder, held.Target, held.ProxyID, lease.UsageCounts{ProxyMillis: added.Milliseconds()})
	}
	return renewed, nil
}

// Release ends who's lease id: its credentials are revoked on its proxy
// and its end recorded. One gone already (or another tenant's, which who
// cannot tell apart) is released all the same: nil.
func (b *Broker) Release(ctx context.Context, who *tenant.Tenant, id string) error {
	held, err := b.Get(ctx, who, id)
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		return nil
	case err != nil:
		return err
	}
	if err := b.store.Release(ctx, held.ID); err != nil {
		return err
	}
	b.revoke(ctx, held)
	now := b.opts.Clock.Now()
	b.record(ctx, lease.LedgerLease, lease.LedgerEnd, held, "", now, 0)
	if unused := held.ExpiresAt.Sub(now); unused > 0 {
		b.countUsage(ctx, held.Holder, held.Target, held.ProxyID, lease.UsageCounts{ProxyMillis: -unused.Milliseconds()})
	}
	return nil
}

// Report records the outcome of a request through who's lease id to
// target (normalized): rate_limited and blocked cool the proxy for target
// for cooldown, and a rate_limited one teaches target's learned pace its
// retryAfter. A refusal reaches every proxy sites see as the same sender
// as the lease's (refusedSender). Only the lease's holder (or the
// platform) reports on it.
func (b *Broker) Report(ctx context.Context, who *tenant.Tenant, id, result, target string, cooldown, retryAfter time.Duration) error {
	target = NormalizeTarget(target)
	held, err := b.store.Get(ctx, id)
	switch {
	case err != nil && !who.All():
		return err
	case err == nil && !holds(who, held):
		return lease.ErrLeaseNotFound
	}
	if err := b.store.Report(ctx, id, result, target, cooldown); err != nil {
		return err
	}
	if err == nil {
		b.countRefusal(ctx, held.Holder, target, held.ProxyID, result)
		o, _ := lease.OutcomeOf(result, held.Holder, "")
		o.Cooldown = cooldown
		b.refusedSender(ctx, held.ProxyID, target, o)
	}
	if result == lease.ResultRateLimited {
		b.pushBack(ctx, target, retryAfter)
	}
	return nil
}

// ReportSession records the outcome of who's gateway session's requests
// to target, as Report does for a lease, with the TLS fingerprint of the
// session's client when this replica's gateway saw it, and tells the
// gateway (its listeners) so it closes the session's open tunnels to a
// rate-limited host. A report about a client the host bans everywhere
// cools no proxy. The report also scores the session's stint (ScoreOf),
// which retires it past TunnelRequest.MaxErrorScore. A refusal that cools
// the proxy reaches every proxy sites see as the same sender
// (refusedSender).
// lease.ErrSessionNotFound when the session has not tunnelled lately.
func (b *Broker) ReportSession(ctx context.Context, who *tenant.Tenant, session, result, target string, cooldown, retryAfter time.Duration) error {
	target = NormalizeTarget(target)
	key := SessionKey(who, session)
	client := b.clientOf(key, target)
	if client != "" && b.ClientBanned(ctx, target, client) {
		// The host bans the client, not the proxy: the block is kept
		// (with its client) but keeps nobody else off the proxy.
		cooldown = 0
	}
	proxy, err := b.store.ReportSession(ctx, lease.SessionReport{Session: key, Reporter: who.Name, Result: result, Target: target,
		Client: client, Cooldown: cooldown, Window: SessionReportWindow, Score: ScoreOf(result)})
	if err != nil {
		return err
	}
	if result == lease.ResultRateLimited {
		b.pushBack(ctx, target, retryAfter)
	}
	b.countRefusal(ctx, who.Name, target, proxy, result)
	if cooldown > 0 {
		o, _ := lease.OutcomeOf(result, who.Name, client)
		o.Cooldown = cooldown
		b.refusedSender(ctx, proxy, target, o)
	}
	b.listeners.notify(SessionReport{Session: key, Target: target, Result: result, Proxy: proxy})
	return nil
}
