package discovery

import (
	"context"
	"fmt"
	"time"
)

// PoolDemand is what the discovery API saw of one ProxyPool's use: the
// signals the pool's autoscaler sizes it by.
type PoolDemand struct {
	// ActiveLeases are the leases its members hold now.
	ActiveLeases int
	// LastRefused is when a lease request selecting the pool was last
	// answered 503 no_proxy_available, on any replica sharing the store
	// (zero: never since the store began). A selector names a pool by name
	// only, so two pools of one name in different namespaces share it.
	LastRefused time.Time
}

// PoolDemand reads one pool's demand from the store. It only reads.
func (s *Server) PoolDemand(ctx context.Context, namespace, pool string) (PoolDemand, error) {
	leases, err := s.store.ActiveLeases(ctx, s.opts.View.poolMembers(namespace, pool))
	if err != nil {
		return PoolDemand{}, fmt.Errorf("counting the leases of pool %s/%s: %w", namespace, pool, err)
	}
	d := PoolDemand{}
	for _, n := range leases {
		d.ActiveLeases += n
	}
	if d.LastRefused, err = s.store.LastRefused(ctx, pool); err != nil {
		return PoolDemand{}, fmt.Errorf("reading when a lease of pool %s/%s was last refused: %w", namespace, pool, err)
	}
	return d, nil
}
