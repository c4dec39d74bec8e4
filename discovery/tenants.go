package discovery

import (
	"context"

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
}

// mayReadAttribution says whether the request's tenant may ask the ledger
// who held an IP: a permission of its own, since the answer names every
// tenant.
func (s *Server) mayReadAttribution(ctx context.Context) (bool, error) {
	t := tenantOf(ctx)
	switch {
	case t.All():
		return true, nil
	case s.opts.Tenants == nil:
		return false, nil
	}
	return s.opts.Tenants.MayReadAttribution(ctx, t)
}

type tenantKey struct{}

// withTenant is ctx carrying the request's tenant.
func withTenant(ctx context.Context, t *tenant.Tenant) context.Context {
	return context.WithValue(ctx, tenantKey{}, t)
}

// tenantOf is the request's tenant (Anonymous when the API is open).
func tenantOf(ctx context.Context) *tenant.Tenant {
	if t, ok := ctx.Value(tenantKey{}).(*tenant.Tenant); ok {
		return t
	}
	return tenant.Anonymous
}

// holds says whether t may see and act on lease l: its holder's, or any
// for a tenant that may lease every proxy.
func holds(t *tenant.Tenant, l lease.Lease) bool { return t.All() || l.Holder == t.Name }

// leasable are the ids among ids that t may lease, in order. Each pool and
// each Proxy of no pool is asked about once per call (and the answers are
// cached beyond it).
func (s *Server) leasable(ctx context.Context, t *tenant.Tenant, ids []string) ([]string, error) {
	if t.All() {
		return ids, nil
	}
	if s.opts.Tenants == nil {
		return nil, nil
	}
	decided := map[tenant.Proxy]bool{}
	var out []string
	for _, id := range ids {
		p, ok := s.opts.View.tenantProxy(id)
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
			if allowed, err = s.opts.Tenants.MayLease(ctx, t, p); err != nil {
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

// leasableCandidates is c narrowed to what t may lease; a narrowed set has
// no Key, so the store keeps no index of it.
func (s *Server) leasableCandidates(ctx context.Context, t *tenant.Tenant, c lease.Candidates) (lease.Candidates, error) {
	if t.All() {
		return c, nil
	}
	ids, err := s.leasable(ctx, t, c.IDs)
	if err != nil {
		return lease.Candidates{}, err
	}
	return lease.Candidates{IDs: ids}, nil
}

// SessionKey is how a gateway session is named in the store and in
// session reports: a tenant's sessions are its own, so two teams' "s1" are
// two sessions.
func SessionKey(t *tenant.Tenant, session string) string {
	if t == nil || t.All() || session == "" {
		return session
	}
	return t.Name + "/" + session
}

// heldLease is the lease id when the request's tenant holds it; another
// tenant's lease is ErrLeaseNotFound, as if it did not exist.
func (s *Server) heldLease(ctx context.Context, id string) (lease.Lease, error) {
	l, err := s.store.Get(ctx, id)
	if err != nil {
		return lease.Lease{}, err
	}
	if !holds(tenantOf(ctx), l) {
		return lease.Lease{}, lease.ErrLeaseNotFound
	}
	return l, nil
}

// visible are the proxies of a listing that the request's tenant may lease.
func (s *Server) visible(ctx context.Context, proxies []ProxyInfo) ([]ProxyInfo, error) {
	t := tenantOf(ctx)
	if t.All() {
		return proxies, nil
	}
	ids := make([]string, len(proxies))
	for i := range proxies {
		ids[i] = proxies[i].ID
	}
	allowed, err := s.leasable(ctx, t, ids)
	if err != nil {
		return nil, err
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
