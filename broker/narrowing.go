package broker

import (
	"sync/atomic"
	"time"

	"k8s.io/utils/lru"

	"github.com/example/egress-proxies-operator/lease"
)

// maxNarrowings bounds the (tenant, selector) pairs whose narrowed
// candidates the broker keeps: far more than the teams and selectors a
// fleet serves at once; the least recently used goes first.
const maxNarrowings = 4096

// narrowings remembers, per tenant and selector, the candidates RBAC let
// the tenant lease, so a tenant's lease costs what a platform's does: the
// fleet is walked and RBAC asked once per pair per TenantReviewTTL (or when
// the selector's candidates change), not per request. Each narrowed set
// has a Key and Version of its own, so the lease store keeps an index of
// it as it does of the view's.
type narrowings struct {
	cache *lru.Cache
	// versions numbers the narrowed sets.
	versions atomic.Uint64
}

// narrowed is one pair's remembered answer.
type narrowed struct {
	// from is the Version of the selector's candidates it was narrowed
	// from; until is when RBAC is asked again.
	from  uint64
	until time.Time
	set   lease.Candidates
}

func newNarrowings() *narrowings { return &narrowings{cache: lru.New(maxNarrowings)} }

// get is the set remembered for key, while it was narrowed from the
// candidates at version from and before its time is up.
func (n *narrowings) get(key string, from uint64, now time.Time) (lease.Candidates, bool) {
	v, ok := n.cache.Get(key)
	if !ok {
		return lease.Candidates{}, false
	}
	e := v.(narrowed)
	if e.from != from || !now.Before(e.until) {
		return lease.Candidates{}, false
	}
	return e.set, true
}

// put remembers ids as key's set, narrowed from the candidates at version
// from, until until; it returns the set with its Key and a new Version.
func (n *narrowings) put(key string, from uint64, until time.Time, ids []string) lease.Candidates {
	set := lease.Candidates{Key: "tenant\x00" + key, Version: n.versions.Add(1), IDs: ids}
	n.cache.Add(key, narrowed{from: from, until: until, set: set})
	return set
}
