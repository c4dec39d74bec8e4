package health

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// probeItem is one probe due in the engine's queue: of a tracked proxy, or
// ahead of a Proxy's status (ProbeAhead).
type probeItem struct {
	key   types.NamespacedName
	ahead bool
}

// aheadProbe is a probe of an address a Proxy's status does not name yet.
type aheadProbe struct {
	identity string
	probeTarget
	// done says the probe has finished: tracker holds its result and
	// started and at when it ran.
	done        bool
	tracker     tracker
	result      Result
	started, at time.Time
}

// FirstProbe is the outcome of a probe ahead of a Proxy's status.
type FirstProbe struct {
	// Verdict is what the one probe decides: Healthy when it passed and one
	// pass is the proxy's success threshold, Unhealthy when it failed and
	// one failure is its failure threshold, Unknown otherwise.
	Verdict Verdict
	// Result is the probe's result; At is when it finished.
	Result Result
	At     time.Time
}

// ProbeAhead probes p at the address its status is about to record, before
// it does, so the reconciler can write a new proxy's first verdict with its
// address: one status write takes it to Ready, where recording the address
// and then the verdict took two (and the second write, its watch events and
// a Ready a probe later were a third of a bring-up's API cost). p carries
// the status the reconciler would write; nothing of it is written here.
//
// The first call asks for the probe and returns false; once it has run, the
// engine notifies (Options.Notify) and a call for the same instance returns
// the outcome and true, for as long as it is fresher than the probe
// interval. When the status with that instance arrives, the engine takes
// the probe as the instance's first: it neither probes it again at once nor
// rewrites a verdict the status already records.
func (e *Engine) ProbeAhead(p *crawlv1alpha1.Proxy) (FirstProbe, bool) {
	key := client.ObjectKeyFromObject(p)
	identity, settings := identityOf(p), e.settingsFor(p)
	now := e.opts.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.ahead[key]; ok && a.identity == identity {
		switch {
		case !a.done:
			return FirstProbe{}, false
		case now.Sub(a.at) < settings.Interval:
			return FirstProbe{Verdict: a.tracker.verdict, Result: a.result, At: a.at}, true
		}
	}
	a := &aheadProbe{identity: identity, probeTarget: probeTargetOf(p, settings, e.opts.CredentialsNamespace)}
	e.ahead[key] = a
	e.queue.Add(probeItem{key: key, ahead: true})
	return FirstProbe{}, false
}

// probeAhead runs the probe ProbeAhead asked for and tells the reconciler;
// it returns false once ctx has ended.
func (e *Engine) probeAhead(ctx context.Context, key types.NamespacedName) bool {
	e.mu.Lock()
	a, ok := e.ahead[key]
	if !ok || a.done {
		e.mu.Unlock()
		return true
	}
	pt := a.probeTarget
	e.mu.Unlock()

	start := e.opts.Clock.Now()
	result := e.probe(ctx, key, pt)
	observeProbe(result, e.opts.Clock.Since(start))

	e.mu.Lock()
	if e.ahead[key] != a {
		e.mu.Unlock()
		return true // asked again for another instance, or deleted
	}
	settings := pt.settings.Value()
	a.tracker.observe(result, settings.FailureThreshold, settings.SuccessThreshold)
	a.result, a.started, a.at, a.done = result, start, e.opts.Clock.Now(), true
	e.mu.Unlock()
	return e.notify(ctx, key)
}

// adoptAheadLocked makes a finished probe ahead of identity the first probe
// of t, a target just made from a status naming identity, when that status
// records the probe's verdict (the reconciler records only a passing one).
// It returns when the probe finished. A probe ahead of another instance
// stays: it is for a status still to come.
func (e *Engine) adoptAheadLocked(key types.NamespacedName, identity string, t *target) (time.Time, bool) {
	a, ok := e.ahead[key]
	if !ok || a.identity != identity {
		return time.Time{}, false
	}
	delete(e.ahead, key)
	if !a.done || a.tracker.verdict != t.written {
		return time.Time{}, false
	}
	t.tracker = a.tracker
	t.lastProbe, t.probedAt = a.started, a.at
	return a.at, true
}

// dropAhead forgets a deleted Proxy's probe ahead.
func (e *Engine) dropAhead(key types.NamespacedName) {
	e.mu.Lock()
	delete(e.ahead, key)
	e.mu.Unlock()
}
