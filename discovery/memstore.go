package discovery

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

	"github.com/example/egress-proxies-operator/operator"
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
	// sessions: the gateway's routes by session, and ordered by the end of
	// their idle time.
	sessions    map[string]*memSession
	sessionEnds heapOf[*memSession]
	// hostLoads: live leases per (proxy, target), absent at zero.
	hostLoads map[string]int
	// tats: the theoretical arrival time of the next request per (proxy,
	// host) and, under "fleet:", per (policy, host); one in the past is as
	// good as none, and sweepTATsLocked drops those now and then.
	tats      map[string]time.Time
	tatsSweep int
	// learned: each host's learned pace.
	learned map[string]Learned
	// limited: the live leases under each Limit key, absent at zero.
	limited map[string]int
	// usage: counts by key, and when each ends.
	usage map[string]*usageCount
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
	// since, ip, hold: the stint on own (Route).
	since    time.Time
	ip, hold string
	detours  map[string]string // host -> proxy
	// reported: host -> the last rate_limited report that cooled a proxy.
	reported map[string]sessionReport
	until    time.Time
	index    int
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
		sessions:    map[string]*memSession{},
		sessionEnds: heapOf[*memSession]{less: func(a, b *memSession) bool { return a.until.Before(b.until) }},
		hostLoads:   map[string]int{},
		tats:        map[string]time.Time{},
		tatsSweep:   1024,
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
		best  string
		wait  time.Duration
		paced bool
		why   = WhyLeastLoaded
	)
	// blocked is a candidate's record with the target, when any proxy has
	// one: among equals, the one blocked least lately goes first.
	var blocked func(id string) float64
	if req.Target != "" && m.outcomes.blockedHosts[req.Target] > 0 {
		blocked = func(id string) float64 { return m.blockedLocked(id, req.Target, now) }
	}
	if req.Target != "" && (req.PaceOf != nil || learned > 0) {
		var e *NoProxyAvailableError
		if best, wait, paced, e = m.pickPacedLocked(set, req, learned, blocked, now); e != nil {
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
	l := &memLease{Lease: Lease{ID: uuid.NewString(), ProxyID: best, Target: req.Target, CreatedAt: now, ExpiresAt: now.Add(req.TTL), Wait: wait, Paced: paced, Holder: req.Holder, Why: why,
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
		m.hostLoads[best+"|"+req.Target]++
	}
	m.moveLocked(best, +1, now)
	return m.withLoadLocked(l), nil
}

// pickPacedLocked is Acquire for a paced target: of the candidates not
// cooling down and under their concurrency limit, the one whose next slot
// comes first (then the least loaded, the least recently leased, by id),
// if it comes within req.MaxWait; that slot is reserved. A linear scan:
// every candidate's slot may differ.
func (m *MemoryStore) pickPacedLocked(set *candidateSet, req AcquireRequest, learned time.Duration, blocked func(string) float64, now time.Time) (string, time.Duration, bool, *NoProxyAvailableError) {
	var best *pacedChoice
	var soonest time.Duration
	causes := map[string]int{}
	for _, id := range req.Candidates.IDs {
		if until, ok := m.heldLocked(id, req.Within); ok {
			causes[CauseExclusive]++
			soonest = minPositive(soonest, until.Sub(now))
			continue
		}
		if req.Exclusive && m.loads[id] > 0 {
			causes[CauseExclusive]++
			continue
		}
		if until, ok := m.cooldowns[id][req.Target]; ok {
			causes[CauseCooling]++
			soonest = minPositive(soonest, until.Sub(now))
			continue
		}
		var declared Pace
		if req.PaceOf != nil {
			declared = req.PaceOf(id)
		}
		p := effectivePace(declared, learned)
		if p.MaxConcurrent > 0 && m.hostLoads[id+"|"+req.Target] >= p.MaxConcurrent {
			causes[CauseConcurrency]++
			continue
		}
		wait := max(gcraWait(m.tats[id+"|"+req.Target], now, p.Interval, p.Burst), m.fleetWaitLocked(p, req.Target, now))
		if wait > req.MaxWait {
			causes[CausePaced]++
			soonest = minPositive(soonest, wait)
			continue
		}
		c := &pacedChoice{id: id, wait: wait, it: set.items[id], pace: p}
		if blocked != nil {
			c.blocked = blocked(id)
		}
		if best == nil || c.before(best) {
			best = c
		}
	}
	if best == nil {
		return "", 0, false, &NoProxyAvailableError{RetryAfter: soonest, Cause: mostCommon(causes)}
	}
	k := best.id + "|" + req.Target
	m.tats[k] = gcraReserve(m.tats[k], now, best.pace.Interval)
	if best.pace.FleetInterval > 0 {
		fk := "fleet:" + best.pace.FleetKey + "|" + req.Target
		m.tats[fk] = gcraReserve(m.tats[fk], now, best.pace.FleetInterval)
	}
	m.sweepTATsLocked(now)
	return best.id, best.wait, !best.pace.IsZero(), nil
}

// heldLocked says whether an exclusive lease other than within holds
// proxy, and until when.
func (m *MemoryStore) heldLocked(proxy, within string) (time.Time, bool) {
	h, ok := m.holds[proxy]
	if !ok || h.ID == within {
		return time.Time{}, false
	}
	return h.ExpiresAt, true
}

// pacedChoice is a candidate for a paced request.
type pacedChoice struct {
	id      string
	wait    time.Duration
	it      *setItem
	pace    Pace
	blocked float64
}

// before orders paced choices: the sooner slot, the fewer leases, the
// better record with the target, then as leaseFirst does.
func (c *pacedChoice) before(o *pacedChoice) bool {
	switch {
	case c.wait != o.wait:
		return c.wait < o.wait
	case c.it.load != o.it.load:
		return c.it.load < o.it.load
	case betterRecord(c.blocked, o.blocked):
		return true
	case betterRecord(o.blocked, c.blocked):
		return false
	}
	return leaseFirst(c.it, o.it)
}

func (m *MemoryStore) fleetWaitLocked(p Pace, target string, now time.Time) time.Duration {
	if p.FleetInterval <= 0 {
		return 0
	}
	return gcraWait(m.tats["fleet:"+p.FleetKey+"|"+target], now, p.FleetInterval, p.FleetBurst)
}

// gcraWait is how long from now until a request conforms to a bucket of
// burst refilled one per interval, whose theoretical arrival time is tat.
func gcraWait(tat, now time.Time, interval time.Duration, burst int) time.Duration {
	if interval <= 0 || tat.IsZero() {
		return 0
	}
	allowed := tat.Add(-time.Duration(max(burst, 1)-1) * interval)
	return max(allowed.Sub(now), 0)
}

// gcraReserve is the bucket's tat once one more request is sent.
func gcraReserve(tat, now time.Time, interval time.Duration) time.Time {
	if interval <= 0 {
		return tat
	}
	if tat.Before(now) {
		tat = now
	}
	return tat.Add(interval)
}

// sweepTATsLocked drops the arrival times already past (as good as none)
// once the map has doubled since the last sweep.
func (m *MemoryStore) sweepTATsLocked(now time.Time) {
	if len(m.tats) < m.tatsSweep {
		return
	}
	for k, tat := range m.tats {
		if !tat.After(now) {
			delete(m.tats, k)
		}
	}
	m.tatsSweep = max(1024, 2*len(m.tats))
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// mostCommon is the cause that held back most candidates ("" for none),
// ties to the first of pace, concurrency, cooling.
func mostCommon(causes map[string]int) string {
	best := ""
	for _, c := range []string{CausePaced, CauseConcurrency, CauseCooling, CauseExclusive} {
		if causes[c] > causes[best] {
			best = c
		}
	}
	return best
}

// PushBack implements Store.
func (m *MemoryStore) PushBack(_ context.Context, host string, retryAfter time.Duration) (Learned, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	cur := m.learnedLocked(host, now)
	l := Learned{Interval: PushedBack(cur.Interval, cur.Since, now, retryAfter), Since: now, PushBacks: cur.PushBacks + 1}
	m.learned[host] = l
	return l, nil
}

// LearnedPace implements Store.
func (m *MemoryStore) LearnedPace(_ context.Context, host string) (Learned, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.learnedLocked(host, m.clock.Now()), nil
}

// learnedLocked is host's learned pace as of now; one decayed to nothing
// is forgotten.
func (m *MemoryStore) learnedLocked(host string, now time.Time) Learned {
	l, ok := m.learned[host]
	if !ok {
		return Learned{}
	}
	eff := LearnedAt(l.Interval, l.Since, now)
	if eff == 0 {
		delete(m.learned, host)
		return Learned{}
	}
	l.Interval = eff
	return l
}

// firstEndLocked is how long until the first live lease under limit key
// ends: a scan, made only when a tenant is at its limit.
func (m *MemoryStore) firstEndLocked(key string, now time.Time) time.Duration {
	var first time.Time
	for _, l := range m.leases {
		if l.limit == key && (first.IsZero() || l.ExpiresAt.Before(first)) {
			first = l.ExpiresAt
		}
	}
	if first.IsZero() {
		return 0
	}
	return first.Sub(now)
}

// Admit implements Store.
func (m *MemoryStore) Admit(_ context.Context, key string, interval time.Duration, burst int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	k := "admit:" + key
	if wait := gcraWait(m.tats[k], now, interval, burst); wait > 0 {
		return &QuotaExceededError{RetryAfter: wait}
	}
	m.tats[k] = gcraReserve(m.tats[k], now, interval)
	m.sweepTATsLocked(now)
	return nil
}

// AddUsage implements Store.
func (m *MemoryStore) AddUsage(_ context.Context, key string, n int64, ttl time.Duration) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	for k, u := range m.usage {
		if !now.Before(u.ends) {
			delete(m.usage, k)
		}
	}
	u, ok := m.usage[key]
	if !ok {
		if n == 0 {
			return 0, nil
		}
		u = &usageCount{ends: now.Add(ttl)}
		m.usage[key] = u
	}
	u.n += n
	return u.n, nil
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
	if out, ok := outcomeOf(result, l.Holder); ok && target != "" {
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

// Route implements Store.
func (m *MemoryStore) Route(_ context.Context, session, host string) (Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	sess, ok := m.sessions[session]
	if !ok {
		return Route{}, nil
	}
	return Route{Own: sess.own, Detour: sess.detours[host], Since: sess.since, IP: sess.ip, Hold: sess.hold}, nil
}

// SetRoute implements Store.
func (m *MemoryStore) SetRoute(_ context.Context, session, host string, set RouteSet) error {
	proxy, own, idle := set.Proxy, set.Own, set.Idle
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	sess, ok := m.sessions[session]
	if !ok {
		sess = &memSession{name: session, detours: map[string]string{}, reported: map[string]sessionReport{}}
		m.sessions[session] = sess
	}
	if own {
		if sess.own != proxy || set.Fresh {
			sess.since, sess.ip, sess.hold = now, set.IP, set.Hold
		}
		sess.own = proxy
		delete(sess.detours, host)
	} else {
		sess.detours[host] = proxy
	}
	sess.until = now.Add(idle)
	if ok {
		heap.Fix(&m.sessionEnds, sess.index)
	} else {
		heap.Push(&m.sessionEnds, sess)
	}
	return nil
}

// ReportSession implements Store.
func (m *MemoryStore) ReportSession(_ context.Context, session, reporter, result, target string, cooldown, window time.Duration) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	sess, ok := m.sessions[session]
	if !ok {
		return "", ErrSessionNotFound
	}
	proxy := sess.own
	if detour := sess.detours[target]; detour != "" {
		proxy = detour
	}
	if proxy == "" {
		return "", ErrSessionNotFound
	}
	if !cools(result) {
		if out, ok := outcomeOf(result, reporter); ok {
			m.recordLocked(proxy, target, out, now)
		}
		return proxy, nil
	}
	if last, ok := sess.reported[target]; ok && now.Sub(last.at) < window {
		return last.proxy, nil
	}
	sess.reported[target] = sessionReport{at: now, proxy: proxy}
	m.coolLocked(proxy, target, now.Add(cooldown))
	out, _ := outcomeOf(result, reporter)
	m.recordLocked(proxy, target, out, now)
	return proxy, nil
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

// Ping implements Store: memory always answers.
func (m *MemoryStore) Ping(context.Context) error { return nil }

// Counts are the live leases and (proxy, target) cooldowns, for metrics.
func (m *MemoryStore) Counts() (leases, cooldowns int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	return len(m.leases), m.nCooling
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
	if l.Target != "" {
		k := l.ProxyID + "|" + l.Target
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

// setLocked returns the index for c, building it when it is new or its
// version moved.
func (m *MemoryStore) setLocked(c Candidates, now time.Time) *candidateSet {
	s, ok := m.sets[c.Key]
	if ok && s.version == c.Version && len(s.items) == len(c.IDs) {
		s.used = now
		return s
	}
	if !ok && c.Key != "" && len(m.sets) >= maxCandidateSets {
		var oldest string
		for k, other := range m.sets {
			if oldest == "" || other.used.Before(m.sets[oldest].used) {
				oldest = k
			}
		}
		delete(m.sets, oldest)
	}
	fresh := &candidateSet{version: c.Version, used: now, items: make(map[string]*setItem, len(c.IDs)),
		heap: heapOf[*setItem]{items: make([]*setItem, 0, len(c.IDs)), less: leaseFirst}}
	for _, id := range c.IDs {
		it := &setItem{id: id, load: m.loads[id]}
		if s != nil {
			if prev, ok := s.items[id]; ok {
				it.lastLeased = prev.lastLeased
			}
		}
		it.index = len(fresh.heap.items)
		fresh.items[id] = it
		fresh.heap.items = append(fresh.heap.items, it)
	}
	heap.Init(&fresh.heap)
	if c.Key != "" { // no key: an index for this call only
		m.sets[c.Key] = fresh
	}
	return fresh
}

// candidateSet indexes one set of candidates by load.
type candidateSet struct {
	version uint64
	used    time.Time
	items   map[string]*setItem
	heap    heapOf[*setItem]
}

// pick returns the least-loaded member (of at most maxLoad leases, when
// not negative) for which skip says false; when there is none, "" and the
// soonest end of what held the skipped ones back. Members popped while
// skipping are pushed back.
func (s *candidateSet) pick(skip func(id string) (time.Time, bool), blocked func(id string) float64, maxLoad int) (best string, soonest time.Time, byRecord bool) {
	var skipped []*setItem
	var first *setItem
	bestBlocked := 0.0
	for s.heap.Len() > 0 {
		top := s.heap.items[0]
		if first != nil && (blocked == nil || top.load != first.load || len(skipped) >= maxRecordTies) {
			break
		}
		if maxLoad >= 0 && top.load > maxLoad {
			break
		}
		cooling := skip
		until, cool := cooling(top.id)
		switch {
		case cool:
			if soonest.IsZero() || until.Before(soonest) {
				soonest = until
			}
		case first == nil:
			first, best = top, top.id
			if blocked != nil {
				bestBlocked = blocked(top.id)
			}
		default:
			if b := blocked(top.id); betterRecord(b, bestBlocked) {
				best, bestBlocked, byRecord = top.id, b, true
			}
		}
		if first != nil && blocked == nil {
			break
		}
		skipped = append(skipped, heap.Pop(&s.heap).(*setItem))
	}
	for _, it := range skipped {
		heap.Push(&s.heap, it)
	}
	return best, soonest, byRecord
}

// maxRecordTies bounds the least-loaded candidates a lease compares by
// their record with its target: enough to steer clear of the few a host
// blocked, at a bounded cost per lease.
const maxRecordTies = 16

type setItem struct {
	id         string
	load       int
	lastLeased time.Time
	index      int
}

// leaseFirst orders a set's members: the fewest leases, then the least
// recently leased, then by id (so a new set's ties are stable).
func leaseFirst(a, b *setItem) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	if !a.lastLeased.Equal(b.lastLeased) {
		return a.lastLeased.Before(b.lastLeased)
	}
	return a.id < b.id
}

func (it *setItem) setIndex(i int) { it.index = i }

type memLease struct {
	Lease
	index int
	// limit is the Limit key it counts under ("" for none).
	limit string
}

func (l *memLease) setIndex(i int) { l.index = i }

type cooldownEnd struct {
	proxy, target string
	until         time.Time
}

// setIndex: cooldown ends are only ever popped, never fixed in place.
func (*cooldownEnd) setIndex(int) {}

// heapOf is a container/heap of items that remember their place in it, for
// heap.Fix and heap.Remove: the store's three heaps (set members, leases by
// end, cooldowns by end) differ only in their order.
type heapOf[T interface{ setIndex(int) }] struct {
	items []T
	less  func(a, b T) bool
}

func (h *heapOf[T]) Len() int           { return len(h.items) }
func (h *heapOf[T]) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *heapOf[T]) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].setIndex(i)
	h.items[j].setIndex(j)
}

func (h *heapOf[T]) Push(x any) {
	it := x.(T)
	it.setIndex(len(h.items))
	h.items = append(h.items, it)
}

func (h *heapOf[T]) Pop() any {
	last := len(h.items) - 1
	it := h.items[last]
	var zero T
	h.items[last] = zero // no reference kept past the heap
	h.items = h.items[:last]
	return it
}

// CountCollectors are the leases_active and cooldowns_active gauges over a
// store's counts, read at scrape time, for every backend alike; a store
// that cannot count then reports them invalid rather than a wrong zero.
func CountCollectors(counts func() (leases, cooldowns int, err error)) []prometheus.Collector {
	return []prometheus.Collector{&countCollector{counts: counts}}
}

var (
	leasesActiveDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "discovery", "leases_active"),
		"Leases not yet released or expired.", nil, nil)
	cooldownsActiveDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "discovery", "cooldowns_active"),
		"(proxy, target) pairs cooling down after a rate_limited report.", nil, nil)
)

type countCollector struct {
	counts func() (int, int, error)
}

func (c *countCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesActiveDesc
	ch <- cooldownsActiveDesc
}

func (c *countCollector) Collect(ch chan<- prometheus.Metric) {
	leases, cooldowns, err := c.counts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(leasesActiveDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(leasesActiveDesc, prometheus.GaugeValue, float64(leases))
	ch <- prometheus.MustNewConstMetric(cooldownsActiveDesc, prometheus.GaugeValue, float64(cooldowns))
}
