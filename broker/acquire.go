package broker

import (
	"context"
	"time"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// acquisition is one request down the acquire path, from the lease API
// or a tunnel: who asks, which of their limits it counts under, the
// candidates they may have, and the target's politeness.
type acquisition struct {
	who *tenant.Tenant
	// limit is LimitLeases or LimitTunnels: the tenant quota it counts
	// toward.
	limit      string
	candidates lease.Candidates
	// target is the normalized host ("" for none).
	target       string
	ttl, maxWait time.Duration
	// exclusive holds the proxy alone; within names the exclusive lease
	// this one shares its proxy with.
	exclusive bool
	within    string
	// hold makes the lease a gateway session's exclusive hold: it lasts
	// while the session does (ttl), for no target, and counts toward no
	// quota (the session's tunnels do).
	hold bool
}

// acquire is the one place a lease is taken: the target's politeness, the
// tenant's quota and the exclusivity asked, on the store's candidates.
// A quota refusal comes back as a *QuotaError.
func (b *Broker) acquire(ctx context.Context, a acquisition) (lease.Lease, error) {
	r := lease.AcquireRequest{
		Candidates: a.candidates, Holder: a.who.Name, Limit: b.limitFor(a.who, a.limit),
		Target: a.target, TTL: a.ttl, PaceOf: b.paceOf(ctx, a.target), Adaptive: b.opts.Politeness.Adaptive && a.target != "",
		MaxWait: a.maxWait, Exclusive: a.exclusive, Within: a.within,
	}
	if a.hold {
		r.Target, r.PaceOf, r.Adaptive, r.Limit = "", nil, false, lease.Limit{}
	}
	l, err := b.store.Acquire(ctx, r)
	return l, b.quotaError(a.who, a.limit, err)
}
