package health

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// probeItem is one piece of work in the engine's queue: a probe of a
// tracked proxy, or (settle) bringing its part of a Proxy's status up to
// date.
type probeItem struct {
	key    types.NamespacedName
	settle bool
	// notify: tell the reconciler of a verdict change another replica
	// recorded (Options.Notify), from a worker rather than the informer.
	notify bool
}

// settleRetry is how soon a status write that failed is tried again.
const settleRetry = time.Second

// knowledge is what the engine knows of one instance: the verdict and the
// result and time that decided it.
type knowledge struct {
	instance  string
	verdict   Verdict
	decided   Result
	decidedAt time.Time
	// probed: the instance has been probed (or its recorded verdict
	// adopted); until then its first probe, due now, writes its status.
	probed bool
	// egressIP and canaries are what its probes and canaries learnt.
	egressIP string
	canaries []crawlv1alpha1.CanaryStatus
}

// knowledge is a copy of what t knows; the caller holds the engine's lock.
func (t *target) knowledge() knowledge {
	return knowledge{instance: t.identity, verdict: t.tracker.verdict, decided: t.tracker.decided,
		decidedAt: t.decidedAt, probed: !t.probedAt.IsZero() || t.written != Unknown,
		egressIP: t.egressIP, canaries: t.canaryStatuses()}
}

// healthPart is the engine's part of a Proxy's status, the fields it owns
// (crawlv1alpha1.FieldManagerHealth).
type healthPart struct {
	healthy, ready metav1.Condition
	lastCheck      *metav1.Time
	instance       string
	egressIP       string
	canaries       []crawlv1alpha1.CanaryStatus
	// record is an External proxy's provisioning record (AsRecorded's),
	// which the engine writes with its verdict; nil for a Managed proxy,
	// whose record is the reconciler's.
	record *crawlv1alpha1.Proxy
}

// healthPartFor is the engine's part of p's status given what the engine
// knows of p's instance (nil: nothing, p does not serve), and whether the
// status p carries is stale: it says something the engine does not know
// (a verdict about another instance, Ready where the rule says otherwise).
// Pure. A status that is merely silent (a proxy whose first probe is still
// to come, or that never served) is not stale: the engine writes nothing
// until it has something to say, so a proxy comes up with one write of
// the engine's, its first verdict. An External proxy is judged as
// AsRecorded says, and its record is stale too when the stored one
// differs: its first verdict and its record are one write.
func healthPartFor(stored *crawlv1alpha1.Proxy, known *knowledge, now time.Time) (healthPart, bool) {
	recorded := stored.AsRecorded()
	part, stale := healthPartOf(recorded, known, now)
	if recorded != stored {
		part.record = recorded
		stale = stale || (part.healthy.Type != "" && stored.ExternalRecordDiffers())
	}
	return part, stale
}

// healthPartOf is healthPartFor of a proxy whose record is p's status.
func healthPartOf(p *crawlv1alpha1.Proxy, known *knowledge, now time.Time) (healthPart, bool) {
	stored := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy)
	storedReady := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionReady)
	if !p.DeletionTimestamp.IsZero() || p.Status.Phase == "" {
		return healthPart{}, false
	}
	part := healthPart{lastCheck: p.Status.LastHealthCheckTime}
	conditions := []metav1.Condition{}
	if stored != nil {
		conditions = append(conditions, *stored)
	}
	var healthy *metav1.Condition
	switch {
	case known == nil || !p.Serving() || known.instance != p.Status.Instance():
		if stored == nil && storedReady == nil {
			return healthPart{}, false
		}
		meta.SetStatusCondition(&conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionUnknown,
			ObservedGeneration: p.Generation, Reason: crawlv1alpha1.ReasonNotServing, Message: "the instance does not serve: no verdict holds"})
	case known.verdict == Unknown:
		misleading := storedReady != nil && storedReady.Status == metav1.ConditionTrue ||
			stored != nil && stored.Status != metav1.ConditionUnknown
		if !known.probed && !misleading {
			return healthPart{}, false
		}
		part.instance, part.egressIP, part.canaries = known.instance, known.egressIP, known.canaries
		meta.SetStatusCondition(&conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionUnknown,
			ObservedGeneration: p.Generation, Reason: crawlv1alpha1.ReasonAwaitingProbe, Message: "no health verdict for this instance yet"})
	default:
		part.instance, part.egressIP, part.canaries = known.instance, known.egressIP, known.canaries
		at := metav1.NewTime(known.decidedAt).Rfc3339Copy() // as stored
		if !known.decidedAt.IsZero() {
			part.lastCheck = &at
		}
		meta.SetStatusCondition(&conditions, verdictCondition(known.verdict, known.decided, p.Generation, at))
		healthy = &conditions[0]
	}
	part.healthy = conditions[0]
	part.ready = p.ReadyCondition(healthy)
	if storedReady != nil && storedReady.Status == part.ready.Status && storedReady.Reason == part.ready.Reason {
		part.ready.LastTransitionTime = storedReady.LastTransitionTime
	} else {
		part.ready.LastTransitionTime = metav1.NewTime(now).Rfc3339Copy()
	}
	stale := stored == nil || storedReady == nil ||
		stored.Status != part.healthy.Status || stored.Reason != part.healthy.Reason ||
		storedReady.Status != part.ready.Status || storedReady.Reason != part.ready.Reason ||
		p.Status.HealthCheckedInstance != part.instance ||
		!part.lastCheck.Equal(p.Status.LastHealthCheckTime) ||
		p.Status.EgressIP != part.egressIP || !equalCanaries(p.Status.Canaries, part.canaries)
	return part, stale
}

// equalCanaries says whether two canary records say the same.
func equalCanaries(a, b []crawlv1alpha1.CanaryStatus) bool {
	return slices.EqualFunc(a, b, func(x, y crawlv1alpha1.CanaryStatus) bool {
		return x.Name == y.Name && x.Host == y.Host && x.Verdict == y.Verdict && x.Message == y.Message &&
			x.LastTransitionTime.Equal(y.LastTransitionTime)
	})
}

// apply is part as an apply configuration of p.
func (part healthPart) apply(p *crawlv1alpha1.Proxy) *acv1alpha1.ProxyApplyConfiguration {
	status := acv1alpha1.ProxyStatus().
		WithConditions(crawlv1alpha1.ConditionApply(part.healthy), crawlv1alpha1.ConditionApply(part.ready)).
		WithHealthCheckedInstance(part.instance).WithEgressIP(part.egressIP)
	if r := part.record; r != nil {
		status.WithPhase(r.Status.Phase).WithMessage(r.Status.Message).WithObservedGeneration(r.Status.ObservedGeneration).
			WithIP(r.Status.IP).WithPort(r.Status.Port).
			WithConditions(crawlv1alpha1.ConditionApply(*meta.FindStatusCondition(r.Status.Conditions, crawlv1alpha1.ConditionProvisioned)))
	}
	for _, c := range part.canaries {
		cs := acv1alpha1.CanaryStatus().WithName(c.Name).WithHost(c.Host).WithVerdict(c.Verdict).WithMessage(c.Message)
		if c.LastTransitionTime != nil {
			cs.WithLastTransitionTime(*c.LastTransitionTime)
		}
		status.WithCanaries(cs)
	}
	if part.lastCheck != nil {
		status.WithLastHealthCheckTime(*part.lastCheck)
	}
	return acv1alpha1.Proxy(p.Name, p.Namespace).WithStatus(status)
}

// settle brings the engine's part of a Proxy's status up to what the
// engine knows, reading the Proxy from the cache; a write that fails is
// tried again after settleRetry. The engine is the only writer of its
// fields, and applies them alone, so a write never conflicts with the
// reconciler's.
func (e *Engine) settle(ctx context.Context, key types.NamespacedName) {
	if !e.owns(key) {
		return // another replica's to record
	}
	var p crawlv1alpha1.Proxy
	if err := e.opts.Client.Get(ctx, key, &p); err != nil {
		if client.IgnoreNotFound(err) != nil {
			logf.FromContext(ctx).Error(err, "reading Proxy to record its health", "proxy", key)
			e.queue.AddAfter(probeItem{key: key, settle: true}, settleRetry)
		}
		return
	}
	e.mu.RLock()
	var known *knowledge
	if t, ok := e.targets[key]; ok {
		k := t.knowledge()
		known = &k
	}
	e.mu.RUnlock()
	part, stale := healthPartFor(&p, known, e.opts.Clock.Now())
	if !stale {
		return
	}
	previous := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy)
	if err := e.opts.Client.Status().Apply(ctx, part.apply(&p), client.FieldOwner(crawlv1alpha1.FieldManagerHealth), client.ForceOwnership); err != nil {
		if client.IgnoreNotFound(err) != nil {
			logf.FromContext(ctx).Error(err, "recording health", "proxy", key, "healthy", part.healthy.Status)
			e.queue.AddAfter(probeItem{key: key, settle: true}, settleRetry)
		}
		return
	}
	statusWrites.Inc()
	e.mu.Lock()
	if t, ok := e.targets[key]; ok && known != nil && t.identity == known.instance {
		t.written = known.verdict
	}
	e.mu.Unlock()
	if known != nil && known.verdict != Unknown && (previous == nil || previous.Status != part.healthy.Status) {
		// A new proxy's first Healthy verdict is its routine bring-up, told
		// by its status; an Event is for a change a person would want to
		// know of: a recovery, or a replacement that serves again.
		firstEver := p.Status.LastHealthCheckTime == nil
		wasUnhealthy := previous != nil && previous.Status == metav1.ConditionFalse
		if known.verdict != Healthy || wasUnhealthy || !firstEver {
			e.recordEvent(&p, known.verdict, known.decided)
		}
	}
}

// verdictCondition is the Healthy condition that records verdict v (Healthy
// or Unhealthy), decided by the result decided.
func verdictCondition(v Verdict, decided Result, generation int64, now metav1.Time) metav1.Condition {
	cond := metav1.Condition{
		Type: crawlv1alpha1.ConditionHealthy, ObservedGeneration: generation, LastTransitionTime: now,
		Status: metav1.ConditionTrue, Reason: ReasonProbeSucceeded, Message: decided.Message,
	}
	if v == Unhealthy {
		cond.Status, cond.Reason = metav1.ConditionFalse, decided.Reason
	}
	return cond
}

// recordedVerdict is the verdict p's status records about its instance,
// since when it holds, and when the probe that decided it ran.
func recordedVerdict(p *crawlv1alpha1.Proxy) (v Verdict, since, at time.Time) {
	c := p.RecordedHealth()
	if c == nil {
		return Unknown, time.Time{}, time.Time{}
	}
	if p.Status.LastHealthCheckTime != nil {
		at = p.Status.LastHealthCheckTime.Time
	}
	if c.Status == metav1.ConditionTrue {
		return Healthy, c.LastTransitionTime.Time, at
	}
	return Unhealthy, c.LastTransitionTime.Time, at
}

// Event reasons of health transitions.
const (
	EventReasonUnhealthy = "Unhealthy"
	EventReasonHealthy   = "Healthy"
	// EventReasonOpenProxy is the Warning for a proxy found open.
	EventReasonOpenProxy = "OpenProxy"
)

// recordEvent tells a person of a recorded verdict change.
func (e *Engine) recordEvent(p *crawlv1alpha1.Proxy, v Verdict, decided Result) {
	if e.opts.Recorder == nil {
		return
	}
	if v == Unhealthy && decided.Reason == ReasonOpenProxy {
		e.opts.Recorder.Eventf(p, nil, corev1.EventTypeWarning, EventReasonOpenProxy, "Probe",
			"never leased: %s. Check the proxy's Squid config (a custom cloud-init must require the credentials in metadata key egress-proxy-password-file) and its firewall", decided.Message)
		return
	}
	if v == Unhealthy {
		e.opts.Recorder.Eventf(p, nil, corev1.EventTypeWarning, EventReasonUnhealthy, "Probe",
			"probes through the proxy fail (%s): %s", decided.Reason, decided.Message)
		return
	}
	e.opts.Recorder.Eventf(p, nil, corev1.EventTypeNormal, EventReasonHealthy, "Probe",
		"probes through the proxy pass: %s", decided.Message)
}
