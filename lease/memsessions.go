package lease

import (
	"container/heap"
	"context"
)

// The memory store's gateway sessions: each session's route per host, and
// its reports.

// minSessionReports is the least number of a session's reported hosts
// that is swept.
const minSessionReports = 64

// Route implements Store.
func (m *MemoryStore) Route(_ context.Context, session, host string) (Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	sess, ok := m.sessions[session]
	if !ok {
		return Route{}, nil
	}
	return Route{Own: sess.own, Detour: sess.detours[host], Since: sess.since, IP: sess.ip, Hold: sess.hold, Score: sess.score, Uses: sess.uses}, nil
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
			sess.since, sess.ip, sess.hold, sess.score, sess.uses = now, set.IP, set.Hold, 0, 0
		}
		sess.own = proxy
		sess.uses++
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
func (m *MemoryStore) ReportSession(_ context.Context, r SessionReport) (string, error) {
	session, result, target := r.Session, r.Result, r.Target
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
		if out, ok := OutcomeOf(result, r.Reporter, r.Client); ok {
			m.recordLocked(proxy, target, out, now)
		}
		sess.mark(proxy, r.Score)
		return proxy, nil
	}
	if last, ok := sess.reported[target]; ok && now.Sub(last.at) < r.Window {
		return last.proxy, nil
	}
	sess.mark(proxy, r.Score)
	sess.reported[target] = sessionReport{at: now, proxy: proxy}
	sweep(sess.reported, &sess.reportedSweep, minSessionReports, func(rep sessionReport) bool { return now.Sub(rep.at) >= r.Window })
	if r.Cooldown > 0 {
		m.coolLocked(proxy, target, now.Add(r.Cooldown))
	}
	out, _ := OutcomeOf(result, r.Reporter, r.Client)
	m.recordLocked(proxy, target, out, now)
	return proxy, nil
}

// MarkSession implements Store.
func (m *MemoryStore) MarkSession(_ context.Context, session, proxy string, delta float64) (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	sess, ok := m.sessions[session]
	if !ok {
		return 0, ErrSessionNotFound
	}
	sess.mark(proxy, delta)
	return sess.score, nil
}

// mark adds delta to the stint's error score when proxy is its own.
func (s *memSession) mark(proxy string, delta float64) {
	if proxy == s.own {
		s.score = max(0, s.score+delta)
	}
}
