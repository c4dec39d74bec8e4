package broker

import (
	"context"
	"fmt"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// PoolDemand is what the discovery API saw of one ProxyPool's use: the
// signals the pool's autoscaler sizes it by.
type PoolDemand struct {
	// ActiveLeases are the leases its members hold now.
	ActiveLeases int
	// Held are the members an exclusive lease holds: each is a member's
	// whole share of demand, whatever its lease count.
	Held int
	// HeldLeases are the leases on those members (in ActiveLeases).
	HeldLeases int
	// LastRefused is when a lease request whose selector matched one of
	// the pool's members was last answered 503 no_proxy_available, on any
	// replica sharing the store (zero: not within RefusedMemory).
	LastRefused time.Time
}

// PoolDemand reads one pool's demand from the store. It only reads.
func (b *Broker) PoolDemand(ctx context.Context, namespace, pool string) (PoolDemand, error) {
	members := b.opts.View.poolMembers(namespace, pool)
	leases, err := b.store.ActiveLeases(ctx, members)
	if err != nil {
		return PoolDemand{}, fmt.Errorf("counting the leases of pool %s/%s: %w", namespace, pool, err)
	}
	held, err := b.store.Held(ctx, members)
	if err != nil {
		return PoolDemand{}, fmt.Errorf("reading the exclusive holds of pool %s/%s: %w", namespace, pool, err)
	}
	d := PoolDemand{}
	for i, n := range leases {
		d.ActiveLeases += n
		if held[i] {
			d.Held++
			d.HeldLeases += n
		}
	}
	if d.LastRefused, err = b.store.LastRefused(ctx, namespace+"/"+pool); err != nil {
		return PoolDemand{}, fmt.Errorf("reading when a lease of pool %s/%s was last refused: %w", namespace, pool, err)
	}
	return d, nil
}

// noteRefused tells the autoscalers of the pools sel names that a lease of
// t's was refused: only pools t may lease, so a tenant never grows
// another's pool (at another's cost) by asking for it.
func (b *Broker) noteRefused(ctx context.Context, t *tenant.Tenant, sel Selector) {
	for _, pool := range b.opts.View.poolsSelected(sel) {
		if !t.All() {
			if b.opts.Tenants == nil {
				return
			}
			if ok, err := b.opts.Tenants.MayLease(ctx, t, pool); err != nil || !ok {
				continue
			}
		}
		key := pool.Namespace + "/" + pool.Pool
		if err := b.store.NoteRefused(ctx, key); err != nil {
			operator.Warn(logf.FromContext(ctx), "could not record a refused lease for the pool's autoscaler", "pool", key, "error", err.Error())
		}
	}
}
