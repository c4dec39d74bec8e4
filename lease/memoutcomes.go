package lease

import (
	"context"
	"slices"
	"strings"
	"time"
)

// OutcomeOf is the outcome a report's result records, reported by
// reporter about client's request (false: none, an error says nothing of
// the host's view of the proxy). The memory store and the broker read
// reports by it.
func OutcomeOf(result, reporter, client string) (Outcome, bool) {
	switch result {
	case ResultOK:
		return Outcome{Source: OutcomeReport, Reporter: reporter, Client: client}, true
	case ResultRateLimited:
		return Outcome{Blocked: true, Limited: true, Source: OutcomeReport, Reporter: reporter, Client: client}, true
	case ResultBlocked:
		return Outcome{Blocked: true, Source: OutcomeReport, Reporter: reporter, Client: client}, true
	}
	return Outcome{}, false
}

// memOutcomes is the memory store's outcome memory: records by proxy and
// host, and burned IPs by scope and IP with the end of their retention.
type memOutcomes struct {
	records map[string]map[string]HostRecord
	// blockedHosts counts, per host, the records with a refusal in them: a
	// lease for a host that refused no proxy skips the tie-break.
	blockedHosts map[string]int
	burned       map[string]time.Time
	// clientBans are the marks by ClientBan, with their ends.
	clientBans map[ClientBan]time.Time
	writes     int
}

func (o *memOutcomes) init() {
	o.records, o.blockedHosts, o.burned = map[string]map[string]HostRecord{}, map[string]int{}, map[string]time.Time{}
	o.clientBans = map[ClientBan]time.Time{}
}

// recordLocked adds out to proxy's record with host at now.
func (m *MemoryStore) recordLocked(proxy, host string, out Outcome, now time.Time) {
	o := &m.outcomes
	hosts := o.records[proxy]
	if hosts == nil {
		hosts = map[string]HostRecord{}
		o.records[proxy] = hosts
	}
	r, ok := hosts[host]
	if !ok {
		r.Host = host
		if len(hosts) >= MaxHostRecords {
			m.dropOldestLocked(proxy, hosts)
		}
	}
	next := r.Recorded(out, now)
	if r.Blocked == 0 && next.Blocked > 0 {
		o.blockedHosts[host]++
	}
	hosts[host] = next
	if o.writes++; o.writes >= 4096 {
		o.writes = 0
		m.sweepOutcomesLocked(now)
	}
}

func (m *MemoryStore) dropOldestLocked(proxy string, hosts map[string]HostRecord) {
	var oldest string
	for h, r := range hosts {
		if oldest == "" || r.At.Before(hosts[oldest].At) {
			oldest = h
		}
	}
	m.forgetRecordLocked(proxy, oldest)
}

func (m *MemoryStore) forgetRecordLocked(proxy, host string) {
	o := &m.outcomes
	if r, ok := o.records[proxy][host]; ok && r.Blocked > 0 {
		if o.blockedHosts[host]--; o.blockedHosts[host] <= 0 {
			delete(o.blockedHosts, host)
		}
	}
	delete(o.records[proxy], host)
	if len(o.records[proxy]) == 0 {
		delete(o.records, proxy)
	}
}

// sweepOutcomesLocked forgets records and burned IPs past their retention.
func (m *MemoryStore) sweepOutcomesLocked(now time.Time) {
	for proxy, hosts := range m.outcomes.records {
		for host, r := range hosts {
			if now.Sub(r.At) >= OutcomeRetention {
				m.forgetRecordLocked(proxy, host)
			}
		}
	}
	for k, until := range m.outcomes.burned {
		if !now.Before(until) {
			delete(m.outcomes.burned, k)
		}
	}
}

// blockedLocked is proxy's decayed blocked weight with host at now.
func (m *MemoryStore) blockedLocked(proxy, host string, now time.Time) float64 {
	r, ok := m.outcomes.records[proxy][host]
	if !ok || r.Blocked == 0 || now.Sub(r.At) >= OutcomeRetention {
		return 0
	}
	return Decayed(r.Blocked, r.At, now)
}

// RecordOutcome implements Store.
func (m *MemoryStore) RecordOutcome(_ context.Context, proxy, host string, out Outcome) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.expireLocked()
	m.recordLocked(proxy, host, out, now)
	if out.Blocked && out.Cooldown > 0 {
		m.coolLocked(proxy, host, now.Add(out.Cooldown))
	}
	return nil
}

// Outcomes implements Store.
func (m *MemoryStore) Outcomes(_ context.Context, proxy string) ([]HostRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	out := make([]HostRecord, 0, len(m.outcomes.records[proxy]))
	for _, r := range m.outcomes.records[proxy] {
		if now.Sub(r.At) < OutcomeRetention {
			out = append(out, r.AsOf(now))
		}
	}
	slices.SortFunc(out, func(a, b HostRecord) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}

// Blocks implements Store: a scan of every record.
func (m *MemoryStore) Blocks(_ context.Context, since time.Time) ([]Block, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	since = laterOf(since, now.Add(-OutcomeRetention))
	var out []Block
	for proxy, hosts := range m.outcomes.records {
		for host, r := range hosts {
			if !r.LastBlocked.IsZero() && !r.LastBlocked.Before(since) {
				out = append(out, Block{Proxy: proxy, Host: host, At: r.LastBlocked, By: r.LastBlockedBy, Voices: slices.Clone(r.Voices), Passes: slices.Clone(r.Passes)})
			}
		}
	}
	return out, nil
}

// ForgetProxy implements Store.
func (m *MemoryStore) ForgetProxy(_ context.Context, proxy string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for host := range m.outcomes.records[proxy] {
		m.forgetRecordLocked(proxy, host)
	}
	if n := len(m.cooldowns[proxy]); n > 0 {
		// Their ends stay in coolEnds; expireLocked skips what is gone.
		m.nCooling -= n
		delete(m.cooldowns, proxy)
	}
	return nil
}

// EndCooldown implements Store.
func (m *MemoryStore) EndCooldown(_ context.Context, proxy, host string, notAfter time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if until, ok := m.cooldowns[proxy][host]; ok && !until.After(notAfter) {
		// Its end stays in coolEnds; expireLocked skips what is gone.
		delete(m.cooldowns[proxy], host)
		m.nCooling--
	}
	return nil
}

// BurnIP implements Store.
func (m *MemoryStore) BurnIP(_ context.Context, scope, ip string, retention time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	k := scope + "|" + ip
	if until := now.Add(retention); until.After(m.outcomes.burned[k]) {
		m.outcomes.burned[k] = until
	}
	return nil
}

// BurnedUntil implements Store.
func (m *MemoryStore) BurnedUntil(_ context.Context, scope, ip string) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	until, ok := m.outcomes.burned[scope+"|"+ip]
	if !ok || !m.clock.Now().Before(until) {
		return time.Time{}, nil
	}
	return until, nil
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// MarkClientBan implements Store.
func (m *MemoryStore) MarkClientBan(_ context.Context, host, client string, retention time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	until := now.Add(retention)
	bans := m.outcomes.clientBans
	for k, end := range bans {
		if !now.Before(end) {
			delete(bans, k)
		}
	}
	k := ClientBan{Host: host, Client: client}
	if _, ok := bans[k]; !ok && len(bans) >= MaxClientBans {
		var first ClientBan
		for b, end := range bans {
			if first.Host == "" || end.Before(bans[first]) {
				first = b
			}
		}
		delete(bans, first)
	}
	if until.After(bans[k]) {
		bans[k] = until
	}
	return nil
}

// ClientBans implements Store.
func (m *MemoryStore) ClientBans(context.Context) ([]ClientBan, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	out := make([]ClientBan, 0, len(m.outcomes.clientBans))
	for k, end := range m.outcomes.clientBans {
		if now.Before(end) {
			out = append(out, ClientBan{Host: k.Host, Client: k.Client, Until: end})
		}
	}
	return out, nil
}
