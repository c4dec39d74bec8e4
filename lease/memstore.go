package lease

import (
	"container/heap"
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// MemoryStore is the embedded Store: exact least-loaded, fast, and gone
// with the process (see the README's restart caveat); one replica only.
//
// Its cost per lease does not grow with the candidates: each candidate set
// (one selector's healthy proxies) keeps a heap of its members ordered by
// (active leases, last leased), so Acquire pops the least-loaded member and
// skips only those cooling down for the target. A lease or release moves its
// proxy in every set that holds it. Leases and cooldowns also sit in heaps by
// their end, so expiry is exact at every call without a sweep, and a proxy
// with no lease has no record at all.
type MemoryStore struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// leases by id, and ordered by ExpiresAt.
	leases   map[string]*memLease
	expiries heapOf[*memLease]
	// loads: active leases per proxy; absent at zero.
	loads map[string]int
	// cooldowns: proxy -> target -> until, dropped when they end; coolEnds
	// holds every end ever set (stale ones are skipped when popped).
	cooldowns map[string]map[string]time.Time
	coolEnds  heapOf[*cooldownEnd]
	nCooling  int
	// sets: one index per candidate set, by Candidates.Key.
	sets    map[string]*candidateSet
	refused map[string]time.Time
	// asked: when each proxy was last asked to be probed (AskProbe).
	asked map[string]time.Time
	// sessions: the gateway's routes by session, and ordered by the end of
	// their idle time.
	sessions    map[string]*memSession
	sessionEnds heapOf[*memSession]
	// hostLoads: live leases per (proxy or pace bucket, target), absent
	// at zero (hostLoadKey).
	hostLoads map[string]int
	// tats: the theoretical arrival time of the next request per (proxy,
	// host) and, under "fleet:", per (policy, host); one in the past is as
	// good as none, and sweepTATsLocked drops those now and then.
	tats      map[string]time.Time
	tatsSweep int
	// learned: each host's learned pace; those decayed to nothing are
	// swept once it doubles.
	learned      map[string]Learned
	learnedSweep int
	// limited: the live leases under each Limit key, absent at zero.
	limited map[string]int
	// usage: counts by key, and when each ends.
	usage map[string]*usageCount
	// usageRows: the usage rows by day (CountUsage), under their own lock.
	usageRows memUsage
	// ledger: the records, oldest first, at most MaxMemoryLedger.
	ledger []LedgerEntry
	// outcomes: the outcome memory (memoutcomes.go).
	outcomes memOutcomes
	// holds: the exclusive lease holding each proxy, absent for none.
	holds map[string]*memLease
}

// MaxMemoryLedger bounds the ledger records the memory store keeps (some
// 20 MiB); the JSON-lines log keeps every one.
const MaxMemoryLedger = 50_000

type usageCount struct {
	n    int64
	ends time.Time
}

// memSession is one gateway session's routes.
type memSession struct {
	name string
	own  string
	// since, ip, hold, score, uses: the stint on own (Route).
	since    time.Time
	ip, hold string
	score    float64
	uses     int64
	detours  map[string]string // host -> proxy
	// reported: host -> the last rate_limited report that cooled a proxy;
	// those past their window are swept once it doubles.
	reported      map[string]sessionReport
	reportedSweep int
	until         time.Time
	index         int
}

func (s *memSession) setIndex(i int) { s.index = i }

type sessionReport struct {
	at    time.Time
	proxy string
}

var _ Store = (*MemoryStore)(nil)

// maxCandidateSets bounds the indexes kept: every lease and release updates
// each set holding its proxy. Selectors in use are few; the least recently
// used set goes first.
const maxCandidateSets = 64

// NewMemoryStore returns an empty store on clk (nil: the real clock).
func NewMemoryStore(clk clock.PassiveClock) *MemoryStore {
	if clk == nil {
		clk = clock.RealClock{}
	}
	m := &MemoryStore{
		clock:       clk,
		expiries:    heapOf[*memLease]{less: func(a, b *memLease) bool { return a.ExpiresAt.Before(b.ExpiresAt) }},
		coolEnds:    heapOf[*cooldownEnd]{less: func(a, b *cooldownEnd) bool { return a.until.Before(b.until) }},
		leases:      map[string]*memLease{},
		loads:       map[string]int{},
		cooldowns:   map[string]map[string]time.Time{},
		sets:        map[string]*candidateSet{},
		refused:     map[string]time.Time{},
		asked:       map[string]time.Time{},
		sessions:    map[string]*memSession{},
		sessionEnds: heapOf[*memSession]{less: func(a, b *memSession) bool { return a.until.Before(b.until) }},
		hostLoads:   map[string]int{},
		tats:        map[string]time.Time{},
		tatsSweep:   minSweep,
		learned:     map[string]Learned{},
		limited:     map[string]int{},
		usage:       map[string]*usageCount{},
		holds:       map[string]*memLease{},
	}
	m.outcomes.init()
	return m
}

// Acquire implements Store: exact least-loaded, ties to the candidate
// leased least recently in this set.
func (m *MemoryStore) Acquire(_ context.Context, req AcquireRequest) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	if req.Limit.Key != "" && m.limited[req.Limit.Key] >= req.Limit.Max {
		return Lease{}, &QuotaExceededError{RetryAfter: m.firstEndLocked(req.Limit.Key, now)}
	}
	set := m.setLocked(req.Candidates, now)
	var learned time.Duration
	if req.Adaptive && req.Target != "" {
		learned = m.learnedLocked(req.Target, now).Interval
	}
	var (
		best string
		wait time.Duration
		pace Pace
		why  = WhyLeastLoaded
	)
	// blocked is a candidate's record with the target, when any proxy has
	// one: among equals, the one blocked least lately goes first.
	var blocked func(id string) float64
	if req.Target != "" && m.outcomes.blockedHosts[req.Target] > 0 {
		blocked = func(id string) float64 { return m.blockedLocked(id, req.Target, now) }
	}
	if req.Target != "" && (req.PaceOf != nil || learned > 0) {
		var e *NoProxyAvailableError
		if best, wait, pace, e = m.pickPacedLocked(set, req, learned, blocked, now); e != nil {
			return Lease{}, e
		}
		why = WhySoonestSlot
	} else {
		var soonest time.Time
		var byRecord bool
		held, cooled := 0, 0
		maxLoad := -1
		if req.Exclusive {
			maxLoad = 0
		}
		best, soonest, byRecord = set.pick(func(id string) (time.Time, bool) {
			if until, ok := m.heldLocked(id, req.Within); ok {
				held++
				return until, true
			}
			if req.Target == "" {
				return time.Time{}, false
			}
			until, ok := m.cooldowns[id][req.Target]
			if ok {
				cooled++
			}
			return until, ok
		}, blocked, maxLoad)
		if byRecord {
			why = WhyBetterRecord
		}
		if best == "" {
			e := &NoProxyAvailableError{}
			switch {
			case held > cooled || (req.Exclusive && cooled == 0 && len(req.Candidates.IDs) > 0):
				e.Cause = CauseExclusive
			case cooled > 0:
				e.Cause = CauseCooling
			}
			if !soonest.IsZero() {
				e.RetryAfter = soonest.Sub(now)
			}
			return Lease{}, e
		}
	}
	l := &memLease{Lease: Lease{ID: uuid.NewString(), ProxyID: best, Target: req.Target, CreatedAt: now, ExpiresAt: now.Add(req.TTL), Wait: wait, Paced: !pace.IsZero(), Holder: req.Holder, Why: why,
		Exclusive: req.Exclusive}, limit: req.Limit.Key}
	if req.Exclusive {
		m.holds[best] = l
	}
	if l.limit != "" {
		m.limited[l.limit]++
	}
	m.leases[l.ID] = l
	heap.Push(&m.expiries, l)
	m.loads[best]++
	if req.Target != "" {
		l.hostLoad = hostLoadKey(pace, best, req.Target)
		m.hostLoads[l.hostLoad]++
	}
	m.moveLocked(best, +1, now)
	return m.withLoadLocked(l), nil
}

// AppendLedger implements Store.
func (m *MemoryStore) AppendLedger(_ context.Context, e LedgerEntry, retention time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	e.At = now
	oldest := now.Add(-retention)
	cut := sort.Search(len(m.ledger), func(i int) bool { return !m.ledger[i].At.Before(oldest) })
	cut = max(cut, len(m.ledger)+1-MaxMemoryLedger)
	// Resliced, not copied: the next growth of the slice leaves the
	// forgotten records behind.
	m.ledger = append(m.ledger[cut:], e)
	return nil
}

// ReadLedger implements Store.
func (m *MemoryStore) ReadLedger(_ context.Context, from, to time.Time) ([]LedgerEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lo := sort.Search(len(m.ledger), func(i int) bool { return !m.ledger[i].At.Before(from) })
	hi := sort.Search(len(m.ledger), func(i int) bool { return m.ledger[i].At.After(to) })
	if hi < lo {
		return nil, nil
	}
	return slices.Clone(m.ledger[lo:hi]), nil
}

// Get implements Store.
func (m *MemoryStore) Get(_ context.Context, id string) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	l, ok := m.leases[id]
	if !ok {
		return Lease{}, ErrLeaseNotFound
	}
	return m.withLoadLocked(l), nil
}

// Renew implements Store.
func (m *MemoryStore) Renew(_ context.Context, id string, ttl time.Duration) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	l, ok := m.leases[id]
	if !ok {
		return Lease{}, ErrLeaseNotFound
	}
	l.ExpiresAt = now.Add(ttl)
	heap.Fix(&m.expiries, l.index)
	return m.withLoadLocked(l), nil
}

// Release implements Store.
func (m *MemoryStore) Release(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	if l, ok := m.leases[id]; ok {
		heap.Remove(&m.expiries, l.index)
		m.dropLocked(l, now)
	}
	return nil
}

// Report implements Store.
func (m *MemoryStore) Report(_ context.Context, id, result, target string, cooldown time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	l, ok := m.leases[id]
	if !ok {
		return ErrLeaseNotFound
	}
	if cools(result) {
		m.coolLocked(l.ProxyID, target, now.Add(cooldown))
	}
	if out, ok := OutcomeOf(result, l.Holder, ""); ok && target != "" {
		m.recordLocked(l.ProxyID, target, out, now)
	}
	return nil
}

// cools says whether a report's result puts its proxy in cooldown for the
// target.
func cools(result string) bool { return result == ResultRateLimited || result == ResultBlocked }

// coolLocked puts proxy in cooldown for target until then, unless a longer
// one is running.
func (m *MemoryStore) coolLocked(proxy, target string, until time.Time) {
	targets := m.cooldowns[proxy]
	if targets == nil {
		targets = map[string]time.Time{}
		m.cooldowns[proxy] = targets
	}
	old, cooling := targets[target]
	if cooling && !until.After(old) {
		return
	}
	if !cooling {
		m.nCooling++
	}
	targets[target] = until
	heap.Push(&m.coolEnds, &cooldownEnd{proxy: proxy, target: target, until: until})
}

// ActiveLeases implements Store: one map lookup per id, whatever the
// number of leases.
func (m *MemoryStore) ActiveLeases(_ context.Context, ids []string) ([]int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = m.loads[id]
	}
	return out, nil
}

// Held implements Store.
func (m *MemoryStore) Held(_ context.Context, ids []string) ([]bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	out := make([]bool, len(ids))
	for i, id := range ids {
		_, out[i] = m.holds[id]
	}
	return out, nil
}

// NoteRefused implements Store.
func (m *MemoryStore) NoteRefused(_ context.Context, pool string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	for p, at := range m.refused {
		if now.Sub(at) >= RefusedMemory {
			delete(m.refused, p)
		}
	}
	m.refused[pool] = now
	return nil
}

// LastRefused implements Store.
func (m *MemoryStore) LastRefused(_ context.Context, pool string) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if at, ok := m.refused[pool]; ok && m.clock.Since(at) < RefusedMemory {
		return at, nil
	}
	return time.Time{}, nil
}

// AskProbe implements Store.
func (m *MemoryStore) AskProbe(_ context.Context, proxy string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked[proxy] = m.clock.Now()
	return nil
}

// ProbesAsked implements Store, and forgets the asks older than
// ProbeAskMemory. The cursor is the store's clock in ms, one ms back from
// now, so an ask in the same ms as a read is read again rather than
// missed.
func (m *MemoryStore) ProbesAsked(_ context.Context, after int64) ([]string, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now().UnixMilli()
	forget := now - ProbeAskMemory.Milliseconds()
	after = max(after, forget)
	var out []string
	for p, at := range m.asked {
		switch ms := at.UnixMilli(); {
		case ms <= forget:
			delete(m.asked, p)
		case ms > after:
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out, now - 1, nil
}

// Ping implements Store: memory always answers.
func (m *MemoryStore) Ping(context.Context) error { return nil }

// Counts are the live leases and (proxy, target) cooldowns, for metrics.
func (m *MemoryStore) Counts() (leases, cooldowns int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	return len(m.leases), m.nCooling
}

// RefusedPools counts the pools whose refused lease requests the store
// remembers.
func (m *MemoryStore) RefusedPools() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.refused)
}

// Collectors are the store's gauges, read at scrape time.
func (m *MemoryStore) Collectors() []prometheus.Collector {
	return CountCollectors(func() (int, int, error) {
		l, c := m.Counts()
		return l, c, nil
	})
}

func (m *MemoryStore) withLoadLocked(l *memLease) Lease {
	out := l.Lease
	out.ProxyLeases = m.loads[l.ProxyID]
	return out
}

// expireLocked drops every lease and cooldown that ended by now, and
// returns now.
func (m *MemoryStore) expireLocked() time.Time {
	now := m.clock.Now()
	for m.expiries.Len() > 0 && !now.Before(m.expiries.items[0].ExpiresAt) {
		m.dropLocked(heap.Pop(&m.expiries).(*memLease), now)
	}
	for m.coolEnds.Len() > 0 && !now.Before(m.coolEnds.items[0].until) {
		end := heap.Pop(&m.coolEnds).(*cooldownEnd)
		targets := m.cooldowns[end.proxy]
		if until, ok := targets[end.target]; !ok || !until.Equal(end.until) {
			continue // extended since: a later end is queued
		}
		delete(targets, end.target)
		m.nCooling--
		if len(targets) == 0 {
			delete(m.cooldowns, end.proxy)
		}
	}
	for m.sessionEnds.Len() > 0 && !now.Before(m.sessionEnds.items[0].until) {
		delete(m.sessions, heap.Pop(&m.sessionEnds).(*memSession).name)
	}
	return now
}

// dropLocked forgets a lease already out of the expiry heap.
func (m *MemoryStore) dropLocked(l *memLease, now time.Time) {
	delete(m.leases, l.ID)
	if m.holds[l.ProxyID] == l {
		delete(m.holds, l.ProxyID)
	}
	if l.limit != "" {
		if m.limited[l.limit] <= 1 {
			delete(m.limited, l.limit)
		} else {
			m.limited[l.limit]--
		}
	}
	if m.loads[l.ProxyID] <= 1 {
		delete(m.loads, l.ProxyID)
	} else {
		m.loads[l.ProxyID]--
	}
	if k := l.hostLoad; k != "" {
		if m.hostLoads[k] <= 1 {
			delete(m.hostLoads, k)
		} else {
			m.hostLoads[k]--
		}
	}
	m.moveLocked(l.ProxyID, -1, now)
}

// moveLocked changes proxy's load by delta in every set that holds it; a
// lease (delta > 0) also makes it the most recently leased.
func (m *MemoryStore) moveLocked(proxy string, delta int, now time.Time) {
	for _, s := range m.sets {
		if it, ok := s.items[proxy]; ok {
			it.load += delta
			if delta > 0 {
				it.lastLeased = now
			}
			heap.Fix(&s.heap, it.index)
		}
	}
}
