package discovery

import (
	"sync"
	"time"
)

// PoolDemand is what the discovery API saw of one ProxyPool's use: the
// signals the pool's autoscaler sizes it by.
type PoolDemand struct {
	// ActiveLeases are the leases its members hold now.
	ActiveLeases int
	// LastRefused is when a lease request selecting the pool was last
	// answered 503 no_proxy_available (zero: never since the process
	// started).
	LastRefused time.Time
}

// refusals remembers, per pool name, the last lease refused for want of a
// proxy. A selector names a pool by name only, so two pools of one name in
// different namespaces share it.
type refusals struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (r *refusals) note(pool string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	r.last[pool] = at
}

func (r *refusals) lastFor(pool string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[pool]
}

// PoolDemand reads one pool's demand: the leases its members hold in this
// process's store and its last refused lease request. It only reads.
func (s *Server) PoolDemand(namespace, pool string) PoolDemand {
	d := PoolDemand{LastRefused: s.refused.lastFor(pool)}
	for _, id := range s.opts.View.poolMembers(namespace, pool) {
		d.ActiveLeases += s.opts.Store.Leases(id)
	}
	return d
}
