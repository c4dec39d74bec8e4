package health

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// urlCount is how many Managed proxies are probed against one URL, how many
// of them are Unhealthy now, and when the URL was last suspect.
type urlCount struct {
	probed, unhealthy int
	// lastSuspect is the last time Options.TargetSuspect held for these
	// counts: stamped at every recount that finds them suspect or ends
	// their suspicion, so it is exact to the verdict that ended it, not to
	// whenever the reconciler happens to look.
	lastSuspect time.Time
}

// countedAs is what a target contributes to the engine's counts per URL now.
type countedAs struct {
	url       string
	unhealthy bool
}

// TargetHealth is what the engine knows of one proxy now.
type TargetHealth struct {
	Verdict Verdict
	// UnhealthySince is when the current Unhealthy verdict began (zero
	// unless Unhealthy).
	UnhealthySince time.Time
	// URL is the probe URL; Probed and Unhealthy count the Managed proxies
	// probed against it and the Unhealthy among them.
	URL               string
	Probed, Unhealthy int
	// LastSuspect is when the URL was last suspect by
	// Options.TargetSuspect (zero: not since the engine started).
	LastSuspect time.Time
}

// Verdict is the current verdict for a proxy; ok is false for proxies the
// engine does not probe (not Ready, or unknown).
func (e *Engine) Verdict(key types.NamespacedName) (Verdict, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok {
		return Unknown, false
	}
	return t.tracker.verdict, true
}

// VerdictAt is Verdict for the proxy as probed at address (host:port): ok is
// false when the engine probes it elsewhere, so a caller that has seen a new
// address before the engine has never reads the old address's verdict.
func (e *Engine) VerdictAt(key types.NamespacedName, address string) (Verdict, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok || t.address != address {
		return Unknown, false
	}
	return t.tracker.verdict, true
}

// Health is what the engine knows of one proxy; ok is false for a proxy it
// does not probe.
func (e *Engine) Health(key types.NamespacedName) (TargetHealth, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok {
		return TargetHealth{}, false
	}
	h := TargetHealth{Verdict: t.tracker.verdict, UnhealthySince: t.unhealthySince, URL: t.settings.Value().URL}
	if c := e.byURL[h.URL]; c != nil {
		h.Probed, h.Unhealthy, h.LastSuspect = c.probed, c.unhealthy, c.lastSuspect
	}
	return h, true
}

// recountLocked moves t's contribution to byURL to what it is now (its URL,
// its verdict); with remove, as t is forgotten, it only takes it away.
func (e *Engine) recountLocked(t *target, remove bool) {
	if old := t.counted; old != nil {
		c := e.byURL[old.url]
		wasSuspect := e.suspect(c)
		c.probed--
		if old.unhealthy {
			c.unhealthy--
		}
		e.noteSuspicion(c, wasSuspect)
		if c.probed == 0 {
			delete(e.byURL, old.url)
		}
		t.counted = nil
	}
	if remove || !t.managed {
		return
	}
	url := t.settings.Value().URL
	c := e.byURL[url]
	if c == nil {
		c = &urlCount{}
		e.byURL[url] = c
	}
	now := &countedAs{url: url, unhealthy: t.tracker.verdict == Unhealthy}
	wasSuspect := e.suspect(c)
	c.probed++
	if now.unhealthy {
		c.unhealthy++
	}
	e.noteSuspicion(c, wasSuspect)
	t.counted = now
}

// suspect says whether c's URL is suspect by Options.TargetSuspect.
func (e *Engine) suspect(c *urlCount) bool {
	return e.opts.TargetSuspect != nil && e.opts.TargetSuspect(c.unhealthy, c.probed)
}

// noteSuspicion stamps c as suspect now if it was before a recount or is
// after it: the counts do not change between recounts, so the recount that
// ends a suspicion is the last moment it held.
func (e *Engine) noteSuspicion(c *urlCount, wasSuspect bool) {
	if wasSuspect || e.suspect(c) {
		c.lastSuspect = e.opts.Clock.Now()
	}
}

// Generation changes whenever any verdict changes (or a proxy starts or
// stops being probed).
func (e *Engine) Generation() uint64 { return e.generation.Load() }
