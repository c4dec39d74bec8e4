package discovery

import (
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Lease is one client's claim on one proxy until ExpiresAt.
type Lease struct {
	ID        string
	ProxyID   string
	Target    string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Report results a client may send.
const (
	ResultOK          = "ok"
	ResultError       = "error"
	ResultRateLimited = "rate_limited"
)

// Errors of the lease store.
var (
	// ErrNoProxyAvailable: no candidate is free of a cooldown for the target.
	ErrNoProxyAvailable = errors.New("no proxy available")
	// ErrLeaseNotFound: the lease never existed, was released or expired.
	ErrLeaseNotFound = errors.New("lease not found")
)

// Store keeps leases and cooldowns. It is an interface so a durable backend
// can replace the in-memory one without touching the HTTP handlers; every
// method is safe for concurrent use.
type Store interface {
	// Acquire leases the least-loaded candidate that is not cooling down for
	// target (ties: the least recently leased), for ttl.
	Acquire(candidates []string, target string, ttl time.Duration, now time.Time) (Lease, error)
	// Get returns a live lease.
	Get(id string, now time.Time) (Lease, error)
	// Renew extends a live lease to now+ttl.
	Renew(id string, ttl time.Duration, now time.Time) (Lease, error)
	// Release ends a lease; releasing an unknown lease is not an error.
	Release(id string)
	// Report records a live lease's outcome; rate_limited puts its proxy in
	// cooldown for target until now+cooldown.
	Report(id, result, target string, cooldown time.Duration, now time.Time) error
	// Expire drops the leases and cooldowns that ended by now.
	Expire(now time.Time)
	// Snapshot counts what is live.
	Snapshot(now time.Time) Snapshot
	// Leases counts one proxy's active leases.
	Leases(proxyID string) int
	// NextCooldownEnd is when the earliest cooldown of candidates for target
	// ends (zero when none is cooling down), for Retry-After.
	NextCooldownEnd(candidates []string, target string, now time.Time) time.Time
}

// Snapshot is a count of live leases and cooldowns.
type Snapshot struct {
	// Leases per proxy id (only proxies with at least one).
	Leases map[string]int
	// ActiveLeases and ActiveCooldowns are the totals.
	ActiveLeases    int
	ActiveCooldowns int
}

// MemoryStore is the in-memory Store: fast, and gone with the process (see
// the README's caveat). One mutex guards everything; a lease is a map insert
// and a scan of the candidates.
type MemoryStore struct {
	mu        sync.Mutex
	leases    map[string]*Lease
	proxies   map[string]*proxyLoad
	cooldowns map[string]map[string]time.Time // proxy -> target -> until
}

type proxyLoad struct {
	active     int
	lastLeased time.Time
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		leases:    map[string]*Lease{},
		proxies:   map[string]*proxyLoad{},
		cooldowns: map[string]map[string]time.Time{},
	}
}

// Acquire implements Store.
func (m *MemoryStore) Acquire(candidates []string, target string, ttl time.Duration, now time.Time) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	best := ""
	var bestLoad proxyLoad
	for _, id := range candidates {
		if target != "" && m.coolingLocked(id, target, now) {
			continue
		}
		var load proxyLoad
		if l := m.proxies[id]; l != nil {
			load = *l
		}
		if best == "" || load.active < bestLoad.active ||
			load.active == bestLoad.active && load.lastLeased.Before(bestLoad.lastLeased) {
			best, bestLoad = id, load
		}
	}
	if best == "" {
		return Lease{}, ErrNoProxyAvailable
	}
	lease := &Lease{ID: uuid.NewString(), ProxyID: best, Target: target, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	m.leases[lease.ID] = lease
	load := m.proxies[best]
	if load == nil {
		load = &proxyLoad{}
		m.proxies[best] = load
	}
	load.active++
	load.lastLeased = now
	return *lease, nil
}

// Get implements Store.
func (m *MemoryStore) Get(id string, now time.Time) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.liveLocked(id, now)
	if err != nil {
		return Lease{}, err
	}
	return *l, nil
}

// Renew implements Store.
func (m *MemoryStore) Renew(id string, ttl time.Duration, now time.Time) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.liveLocked(id, now)
	if err != nil {
		return Lease{}, err
	}
	l.ExpiresAt = now.Add(ttl)
	return *l, nil
}

// Release implements Store.
func (m *MemoryStore) Release(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropLocked(id)
}

// Report implements Store.
func (m *MemoryStore) Report(id, result, target string, cooldown time.Duration, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.liveLocked(id, now)
	if err != nil {
		return err
	}
	if result != ResultRateLimited {
		return nil
	}
	targets := m.cooldowns[l.ProxyID]
	if targets == nil {
		targets = map[string]time.Time{}
		m.cooldowns[l.ProxyID] = targets
	}
	if until := now.Add(cooldown); until.After(targets[target]) {
		targets[target] = until
	}
	return nil
}

// Expire implements Store.
func (m *MemoryStore) Expire(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, l := range m.leases {
		if !now.Before(l.ExpiresAt) {
			m.dropLocked(id)
		}
	}
	for proxy, targets := range m.cooldowns {
		for target, until := range targets {
			if !now.Before(until) {
				delete(targets, target)
			}
		}
		if len(targets) == 0 {
			delete(m.cooldowns, proxy)
		}
	}
}

// Snapshot implements Store.
func (m *MemoryStore) Snapshot(now time.Time) Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Snapshot{Leases: map[string]int{}}
	for _, l := range m.leases {
		if now.Before(l.ExpiresAt) {
			s.Leases[l.ProxyID]++
			s.ActiveLeases++
		}
	}
	for _, targets := range m.cooldowns {
		for _, until := range targets {
			if now.Before(until) {
				s.ActiveCooldowns++
			}
		}
	}
	return s
}

// Leases implements Store.
func (m *MemoryStore) Leases(proxyID string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if load := m.proxies[proxyID]; load != nil {
		return load.active
	}
	return 0
}

// NextCooldownEnd implements Store.
func (m *MemoryStore) NextCooldownEnd(candidates []string, target string, now time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	var soonest time.Time
	for _, id := range candidates {
		if until, ok := m.cooldowns[id][target]; ok && now.Before(until) && (soonest.IsZero() || until.Before(soonest)) {
			soonest = until
		}
	}
	return soonest
}

func (m *MemoryStore) coolingLocked(proxy, target string, now time.Time) bool {
	until, ok := m.cooldowns[proxy][target]
	return ok && now.Before(until)
}

// liveLocked returns a lease that has not expired, dropping it lazily if it
// has.
func (m *MemoryStore) liveLocked(id string, now time.Time) (*Lease, error) {
	l, ok := m.leases[id]
	if !ok {
		return nil, ErrLeaseNotFound
	}
	if !now.Before(l.ExpiresAt) {
		m.dropLocked(id)
		return nil, ErrLeaseNotFound
	}
	return l, nil
}

func (m *MemoryStore) dropLocked(id string) {
	l, ok := m.leases[id]
	if !ok {
		return
	}
	delete(m.leases, id)
	// Each lease is dropped once, so the count never goes below zero;
	// lastLeased stays for tie-breaking.
	m.proxies[l.ProxyID].active--
}
