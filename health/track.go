package health

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unique"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// probeTarget is what a probe of a proxy needs: where it listens, how it
// is probed, and with which credentials.
type probeTarget struct {
	address string
	// settings and creds are handles: a fleet shares a few of each, and a
	// handle is 8 bytes where each copy was 48 and 64, for every proxy.
	settings unique.Handle[Settings]
	// creds is where the proxy's credentials are (hasCreds false: it takes
	// none); checkOpen probes it without them too.
	creds     unique.Handle[credentials.Ref]
	hasCreds  bool
	checkOpen bool
}

// probeTargetOf is how a Proxy whose status is p's is probed.
func probeTargetOf(p *crawlv1alpha1.Proxy, settings Settings, credentialsNamespace string) probeTarget {
	ref, hasCreds := credentials.RefFor(p, credentialsNamespace)
	return probeTarget{address: addressOf(p), settings: unique.Make(settings), creds: unique.Make(ref), hasCreds: hasCreds, checkOpen: checksOpen(p)}
}

// target is one probed proxy.
type target struct {
	// identity changes when the proxy is replaced: a replacement starts from
	// a clean slate.
	identity string
	probeTarget
	managed bool
	tracker tracker
	// written is the verdict last recorded in status.
	written Verdict
	// decidedAt is when the probe that decided the verdict finished: the
	// status's lastHealthCheckTime.
	decidedAt time.Time
	// unhealthySince is when the current Unhealthy verdict began.
	unhealthySince time.Time
	// lastProbe is when the last probe started (zero: none yet).
	lastProbe time.Time
	// probedAt is when the last probe of this instance finished (zero:
	// none yet), for the last-probe metric.
	probedAt time.Time
	// counted is the contribution to byURL now: url, and whether Unhealthy.
	counted *countedAs
	// owned: this replica probes the proxy (always without a Shard);
	// otherwise its verdict is what its status records. cancelProbe
	// cancels the probe in flight, if any, when it is handed over.
	owned       bool
	cancelProbe context.CancelFunc
	// idle: it had no live lease when this replica last read the
	// traffic (Options.Traffic), so it is probed at the idle interval.
	idle bool
	// egressIP is the instance's exit IP when it differs from its address
	// ("" otherwise, or unknown), as the echo URL last said at
	// egressCheckedAt.
	egressIP        string
	egressCheckedAt time.Time
	// canaries are the proxy's canaries (its spec's), and canaryStates
	// what each last came to, by name.
	canaries     []crawlv1alpha1.CanaryTarget
	canaryStates map[string]*canaryState
}

// canaryState is one canary of one instance: its last verdict, and when
// it is due again.
type canaryState struct {
	status crawlv1alpha1.CanaryStatus
	due    time.Time
	// heldUntil is when the hold a Blocked verdict put on the proxy for
	// the canary's host ends, unless renewed or ended (zero: none).
	heldUntil time.Time
}

// track starts, updates or stops probing a Proxy as its status says (an
// External proxy's as its spec does: its record is the engine's to write).
func (e *Engine) track(stored *crawlv1alpha1.Proxy) {
	key := client.ObjectKeyFromObject(stored)
	p := stored.AsRecorded()
	if !p.Serving() {
		e.forget(key)
		if _, stale := healthPartFor(stored, nil, e.opts.Clock.Now()); stale {
			e.queue.Add(probeItem{key: key, settle: true})
		}
		return
	}
	settings := e.settingsFor(p)
	identity := p.Status.Instance()
	now := e.opts.Clock.Now()
	e.mu.Lock()
	t, exists := e.targets[key]
	replaced := exists && t.identity != identity
	var old *target
	if replaced {
		old = t
	}
	if !exists || replaced {
		// A new or replaced proxy starts from the verdict its status records
		// about this very instance: none after a replacement or a new
		// address, the recorded one after an operator restart (so a restart
		// causes no status writes).
		recorded, since, at := recordedVerdict(p)
		t = &target{identity: identity, written: recorded, decidedAt: at, tracker: tracker{verdict: recorded}}
		if recorded == Unhealthy {
			t.unhealthySince = since
		}
		if p.Status.HealthCheckedInstance == identity {
			// What the status records of this instance holds until
			// learnt again (after a restart: no write, no burst of
			// canaries).
			t.adoptRecorded(p, now, settings.Interval, e.spread)
		}
		if old != nil {
			t.counted = old.counted // recountLocked moves it
			t.owned, t.cancelProbe = old.owned, old.cancelProbe
		} else {
			t.owned = e.owns(key)
		}
		e.targets[key] = t
		e.generation.Add(1)
	}
	resettle := exists && !replaced && t.settings.Value() != settings
	t.probeTarget = probeTargetOf(p, settings, e.opts.CredentialsNamespace)
	t.managed = p.Spec.Mode == crawlv1alpha1.ModeManaged
	t.setCanaries(canariesOf(p))
	if !t.owned {
		// Another replica probes it: its verdict is what that one records.
		followed := t.followRecorded(p)
		e.recountLocked(t, false)
		managed := t.managed
		e.mu.Unlock()
		if followed {
			e.generation.Add(1)
			if managed {
				e.queue.Add(probeItem{key: key, notify: true})
			}
		}
		return
	}
	e.recountLocked(t, false)
	// Decided under the lock: a probe worker may be changing the verdict
	// and the last probe's time as soon as it is released.
	due, schedule := e.firstProbeDue(tracked{
		exists: exists, replaced: replaced, resettle: resettle,
		everProbed: p.Status.LastHealthCheckTime != nil, lastProbe: t.lastProbe, verdict: t.tracker.verdict,
	}, settings, now)
	known := t.knowledge()
	e.mu.Unlock()
	if schedule {
		e.queue.AddAfter(probeItem{key: key}, due)
	}
	if _, stale := healthPartFor(stored, &known, now); stale {
		e.queue.Add(probeItem{key: key, settle: true})
	}
}

// followRecorded takes the verdict p's status records about t's instance,
// as recorded by the replica that probes it, and says whether it changed.
func (t *target) followRecorded(p *crawlv1alpha1.Proxy) bool {
	recorded, since, at := recordedVerdict(p)
	if recorded == t.tracker.verdict && at.Equal(t.decidedAt) {
		return false
	}
	changed := recorded != t.tracker.verdict
	t.tracker = tracker{verdict: recorded}
	t.written, t.decidedAt, t.unhealthySince = recorded, at, time.Time{}
	if recorded == Unhealthy {
		t.unhealthySince = since
	}
	if p.Status.HealthCheckedInstance == t.identity {
		t.egressIP = p.Status.EgressIP
	}
	return changed
}

// tracked is what track knows of a proxy it just took up or updated.
type tracked struct {
	exists, replaced, resettle bool
	// everProbed: the status records a probe by anyone.
	everProbed bool
	lastProbe  time.Time
	verdict    Verdict
}

// firstProbeDue is when a tracked proxy is probed next, or schedule false
// when its schedule stands. Jitter aside (spread, nextProbe), it is pure.
func (e *Engine) firstProbeDue(t tracked, settings Settings, now time.Time) (due time.Duration, schedule bool) {
	switch {
	case t.replaced:
		// A replaced instance or a changed address is probed at once: an
		// address nobody has probed is never served on an old verdict.
		return 0, true
	case !t.exists && !t.everProbed:
		// A new proxy, never probed by anyone: not Ready until its first
		// verdict, so that verdict is due now.
		return 0, true
	case !t.exists:
		// Known before this engine started (a restart, a new leader):
		// spread over the whole interval, so the fleet is probed at the
		// rate it keeps rather than all at once.
		return e.spreadOver(settings.Interval), true
	case t.resettle:
		// New settings take effect at the next probe, due by the new
		// interval; the queue keeps whichever time comes first.
		if t.lastProbe.IsZero() {
			return 0, true
		}
		return max(0, t.lastProbe.Add(settings.Interval).Sub(now)), true
	}
	return 0, false
}

// forget stops probing a proxy and drops its verdict.
func (e *Engine) forget(key types.NamespacedName) {
	e.mu.Lock()
	if t, ok := e.targets[key]; ok {
		e.recountLocked(t, true)
		delete(e.targets, key)
		e.generation.Add(1)
	}
	e.mu.Unlock()
}

// addressOf is where a Proxy's status says it listens (host:port); an
// External proxy's is AsRecorded's.
func addressOf(p *crawlv1alpha1.Proxy) string {
	return net.JoinHostPort(p.Status.IP, strconv.Itoa(int(p.Status.Port)))
}

// checksOpen says whether a proxy's probes also check that it refuses a
// stranger: every Managed proxy must; an External one is checked when its
// spec asks.
func checksOpen(p *crawlv1alpha1.Proxy) bool {
	return p.Spec.Mode == crawlv1alpha1.ModeManaged || p.Spec.External != nil && p.Spec.External.OpenProxyCheck
}

// settingsFor applies a Proxy's overrides to the defaults.
func (e *Engine) settingsFor(p *crawlv1alpha1.Proxy) Settings {
	s := e.opts.Defaults
	hc := p.Spec.HealthCheck
	if hc == nil {
		return s
	}
	if hc.URL != "" {
		s.URL = hc.URL
	}
	if hc.Interval != nil {
		s.Interval = hc.Interval.Duration
	}
	if hc.Timeout != nil {
		s.Timeout = hc.Timeout.Duration
	}
	if hc.FailureThreshold != nil {
		s.FailureThreshold = int(*hc.FailureThreshold)
	}
	if hc.SuccessThreshold != nil {
		s.SuccessThreshold = int(*hc.SuccessThreshold)
	}
	return s
}

// canariesOf is a Proxy's canaries (spec.healthCheck.targets).
func canariesOf(p *crawlv1alpha1.Proxy) []crawlv1alpha1.CanaryTarget {
	if p.Spec.HealthCheck == nil {
		return nil
	}
	return p.Spec.HealthCheck.Targets
}

// setCanaries takes the spec's canaries, forgetting the states of those
// no longer in it.
func (t *target) setCanaries(canaries []crawlv1alpha1.CanaryTarget) {
	t.canaries = canaries
	for name := range t.canaryStates {
		if !slices.ContainsFunc(canaries, func(c crawlv1alpha1.CanaryTarget) bool { return c.Name == name }) {
			delete(t.canaryStates, name)
		}
	}
}

// adoptRecorded takes the exit IP and canary verdicts p's status records
// about its instance; the canaries are due again spread over interval.
func (t *target) adoptRecorded(p *crawlv1alpha1.Proxy, now time.Time, interval time.Duration, spread func(time.Duration) time.Duration) {
	t.egressIP = p.Status.EgressIP
	for _, c := range p.Status.Canaries {
		if t.canaryStates == nil {
			t.canaryStates = map[string]*canaryState{}
		}
		t.canaryStates[c.Name] = &canaryState{status: *c.DeepCopy(), due: now.Add(spread(interval))}
	}
}

// learnEgress takes the exit IP a probe's echo reported (none: nothing to
// learn) for the instance at address, and says whether it changed.
func (t *target) learnEgress(r Result, address string) bool {
	if r.EgressIP == "" {
		return false
	}
	t.egressCheckedAt = t.probedAt
	egress := r.EgressIP
	if host, _, err := net.SplitHostPort(address); err == nil && host == egress {
		egress = ""
	}
	if egress == t.egressIP {
		return false
	}
	t.egressIP = egress
	return true
}

// dueCanaries are the canaries due by now.
func (t *target) dueCanaries(now time.Time) []crawlv1alpha1.CanaryTarget {
	var due []crawlv1alpha1.CanaryTarget
	for _, c := range t.canaries {
		if st := t.canaryStates[c.Name]; st == nil || !now.Before(st.due) {
			due = append(due, c)
		}
	}
	return due
}

// canaryStatuses are the verdicts to record, by name.
func (t *target) canaryStatuses() []crawlv1alpha1.CanaryStatus {
	var out []crawlv1alpha1.CanaryStatus
	for _, c := range t.canaries {
		if st := t.canaryStates[c.Name]; st != nil && st.status.Verdict != "" {
			out = append(out, st.status)
		}
	}
	slices.SortFunc(out, func(a, b crawlv1alpha1.CanaryStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}
