package lease

import (
	"context"
	"time"
)

// The memory store's pacing: the paced choice of a proxy for a target, the
// GCRA slots per (proxy, host) and per fleet key, the learned paces, and
// the rates and counts of tenants' quotas.

// pickPacedLocked is Acquire for a paced target: of the candidates not
// cooling down and under their concurrency limit, the one whose next slot
// comes first (then the least loaded, the least recently leased, by id),
// if it comes within req.MaxWait; that slot is reserved, and the pace the
// lease keeps returned. A linear scan:
// every candidate's slot may differ.
func (m *MemoryStore) pickPacedLocked(set *candidateSet, req AcquireRequest, learned time.Duration, blocked func(string) float64, now time.Time) (string, time.Duration, Pace, *NoProxyAvailableError) {
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
		if p.MaxConcurrent > 0 && m.hostLoads[hostLoadKey(p, id, req.Target)] >= p.MaxConcurrent {
			causes[CauseConcurrency]++
			continue
		}
		wait := m.slotWaitLocked(p, id, req.Target, now)
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
		return "", 0, Pace{}, &NoProxyAvailableError{RetryAfter: soonest, Cause: mostCommon(causes)}
	}
	m.reserveSlotLocked(best.pace, best.id, req.Target, now)
	return best.id, best.wait, best.pace, nil
}

// hostLoadKey is where a lease of proxy for target counts toward p's
// MaxConcurrent: its bucket's count (every proxy of one sender, netid,
// shares it, as a site counts connections per sender), else its own.
func hostLoadKey(p Pace, proxy, target string) string {
	return p.BucketOf(proxy) + "|" + target
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

// slotWaitLocked is how long from now until proxy's next slot for target
// under p: its bucket's (BucketOf) and the fleet's.
func (m *MemoryStore) slotWaitLocked(p Pace, proxy, target string, now time.Time) time.Duration {
	wait := gcraWait(m.tats[p.BucketOf(proxy)+"|"+target], now, p.Interval, p.Burst)
	if p.FleetInterval > 0 {
		wait = max(wait, gcraWait(m.tats["fleet:"+p.FleetKey+"|"+target], now, p.FleetInterval, p.FleetBurst))
	}
	return wait
}

// reserveSlotLocked takes proxy's next slot for target under p, in its
// bucket and the fleet's.
func (m *MemoryStore) reserveSlotLocked(p Pace, proxy, target string, now time.Time) {
	k := p.BucketOf(proxy) + "|" + target
	m.tats[k] = gcraReserve(m.tats[k], now, p.Interval)
	if p.FleetInterval > 0 {
		fk := "fleet:" + p.FleetKey + "|" + target
		m.tats[fk] = gcraReserve(m.tats[fk], now, p.FleetInterval)
	}
	m.sweepTATsLocked(now)
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
	sweep(m.tats, &m.tatsSweep, minSweep, func(tat time.Time) bool { return !tat.After(now) })
}

// minSweep is the least size of a host-keyed map that is swept.
const minSweep = 1024

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

// Slot implements Store.
func (m *MemoryStore) Slot(_ context.Context, proxy, target string, p Pace, adaptive bool, maxWait time.Duration) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if adaptive {
		p = effectivePace(p, m.learnedLocked(target, now).Interval)
	}
	wait := m.slotWaitLocked(p, proxy, target, now)
	if wait > maxWait {
		return 0, &NoProxyAvailableError{RetryAfter: wait, Cause: CausePaced}
	}
	m.reserveSlotLocked(p, proxy, target, now)
	return wait, nil
}

// PushBack implements Store.
func (m *MemoryStore) PushBack(_ context.Context, host string, retryAfter time.Duration) (Learned, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	cur := m.learnedLocked(host, now)
	l := Learned{Interval: PushedBack(cur.Interval, cur.Since, now, retryAfter), Since: now, PushBacks: cur.PushBacks + 1}
	m.learned[host] = l
	sweep(m.learned, &m.learnedSweep, minSweep, func(l Learned) bool { return LearnedAt(l.Interval, l.Since, now) == 0 })
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
