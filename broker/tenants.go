package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// Tenants identifies the clients whose bearer token is not the discovery
// token (ServiceAccount tokens) and says what they may lease
// (tenant.Checker).
type Tenants interface {
	Identify(ctx context.Context, token string) (*tenant.Tenant, error)
	MayLease(ctx context.Context, t *tenant.Tenant, p tenant.Proxy) (bool, error)
	MayReadAttribution(ctx context.Context, t *tenant.Tenant) (bool, error)
	MayReadUsage(ctx context.Context, t *tenant.Tenant) (bool, error)
}

// MayReadAttribution says whether who may ask the ledger who held an IP:
// a permission of its own, since the answer names every tenant.
func (b *Broker) MayReadAttribution(ctx context.Context, who *tenant.Tenant) (bool, error) {
	return b.mayReadAll(ctx, who, Tenants.MayReadAttribution)
}

// MayReadUsage says whether who may read every team's usage (a team
// reads its own).
func (b *Broker) MayReadUsage(ctx context.Context, who *tenant.Tenant) (bool, error) {
	return b.mayReadAll(ctx, who, Tenants.MayReadUsage)
}

// mayReadAll answers a cluster-wide read permission: the platform has it,
// nobody without Tenants does, and RBAC (ask) says for the others; an RBAC
// that cannot answer is ErrTenantsUnavailable.
func (b *Broker) mayReadAll(ctx context.Context, who *tenant.Tenant, ask func(Tenants, context.Context, *tenant.Tenant) (bool, error)) (bool, error) {
	switch {
	case who.All():
		return true, nil
	case b.opts.Tenants == nil:
		return false, nil
	}
	ok, err := ask(b.opts.Tenants, ctx, who)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrTenantsUnavailable, err)
	}
	return ok, nil
}

// holds says whether t may see and act on lease l: its holder's, or any
// for a tenant that may lease every proxy.
func holds(t *tenant.Tenant, l lease.Lease) bool { return t.All() || l.Holder == t.Name }

// leasable are the ids among ids that t may lease, in order. Each pool and
// each Proxy of no pool is asked about once per call (and the answers are
// cached beyond it).
func (b *Broker) leasable(ctx context.Context, t *tenant.Tenant, ids []string) ([]string, error) {
	if t.All() {
		return ids, nil
	}
	if b.opts.Tenants == nil {
		return nil, nil
	}
	decided := map[tenant.Proxy]bool{}
	var out []string
	for _, id := range ids {
		p, ok := b.opts.View.tenantProxy(id)
		if !ok {
			continue
		}
		key := p
		if p.Pool != "" {
			key.Name = "" // one answer for every member
		}
		allowed, seen := decided[key]
		if !seen {
			var err error
			if allowed, err = b.opts.Tenants.MayLease(ctx, t, p); err != nil {
				return nil, err
			}
			decided[key] = allowed
		}
		if allowed {
			out = append(out, id)
		}
	}
	return out, nil
}

// candidates are the healthy proxies sel matches that t may lease: for a
// tenant, the set remembered for (t, sel) while the selector's candidates
// are unchanged and TenantReviewTTL has not passed, else narrowed anew
// (narrowings). An error is RBAC's that could not answer
// (ErrTenantsUnavailable).
func (b *Broker) candidates(ctx context.Context, t *tenant.Tenant, sel Selector) (lease.Candidates, error) {
	c := b.opts.View.candidates(sel)
	if t.All() {
		return c, nil
	}
	key, now := t.Name+"\x00"+c.Key, b.opts.Clock.Now()
	if b.opts.TenantReviewTTL > 0 {
		if set, ok := b.narrowed.get(key, c.Version, now); ok {
			return set, nil
		}
	}
	ids, err := b.leasable(ctx, t, c.IDs)
	if err != nil {
		return lease.Candidates{}, fmt.Errorf("%w: %w", ErrTenantsUnavailable, err)
	}
	if b.opts.TenantReviewTTL <= 0 {
		return lease.Candidates{IDs: ids}, nil // no index of a set narrowed for this call alone
	}
	return b.narrowed.put(key, c.Version, now.Add(b.opts.TenantReviewTTL), ids), nil
}

// ErrTenantsUnavailable says what a tenant may lease could not be decided
// (the API server did not answer a SubjectAccessReview).
var ErrTenantsUnavailable = errors.New("tenant permissions unavailable")

// SessionKey is how a gateway session is named in the store and in
// session reports: a tenant's sessions are its own, so two teams' "s1" are
// two sessions.
func SessionKey(t *tenant.Tenant, session string) string {
	if t == nil || t.All() || session == "" {
		return session
	}
	return t.Name + "/" + session
}

// Get is the lease id when who holds it; another tenant's lease is
// lease.ErrLeaseNotFound, as if it did not exist.
func (b *Broker) Get(ctx context.Context, who *tenant.Tenant, id string) (lease.Lease, error) {
	l, err := b.store.Get(ctx, id)
	if err != nil {
		return lease.Lease{}, err
	}
	if !holds(who, l) {
		return lease.Lease{}, lease.ErrLeaseNotFound
	}
	return l, nil
}

// Visible are the proxies of a listing that who may lease.
func (b *Broker) Visible(ctx context.Context, t *tenant.Tenant, proxies []ProxyInfo) ([]ProxyInfo, error) {
	if t.All() {
		return proxies, nil
	}
	ids := make([]string, len(proxies))
	for i := range proxies {
		ids[i] = proxies[i].ID
	}
	allowed, err := b.leasable(ctx, t, ids)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTenantsUnavailable, err)
	}
	keep := make(map[string]bool, len(allowed))
	for _, id := range allowed {
		keep[id] = true
	}
	out := proxies[:0]
	for _, p := range proxies {
		if keep[p.ID] {
			out = append(out, p)
		}
	}
	return out, nil
}
