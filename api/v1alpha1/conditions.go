package v1alpha1

import (
	"net"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of the Healthy and Ready conditions, both the health engine's.
const (
	// ReasonAwaitingProbe: the instance serves and has no verdict yet.
	ReasonAwaitingProbe = "AwaitingProbe"
	// ReasonNotServing: the instance does not serve (not running as
	// specified, being replaced or deleted), so no verdict holds.
	ReasonNotServing = "NotServing"
	// ReasonProxyReady: provisioned and healthy.
	ReasonProxyReady = "ProxyReady"
	// ReasonNotProvisioned: the instance is not running as specified.
	ReasonNotProvisioned = "NotProvisioned"
	// ReasonNotHealthy: the instance runs but probes through it do not pass.
	ReasonNotHealthy = "NotHealthy"
	// ReasonUnhealthyTooLong: the proxy failed its probes for longer than
	// its replacement period. On a pool member the Proxy reconciler writes
	// it to the Provisioned condition instead of replacing the instance,
	// and the pool replaces the member under its disruption budget.
	ReasonUnhealthyTooLong = "UnhealthyTooLong"
	// ReasonBanned: the proxy's instance is banned (the Banned condition).
	// On a pool member the Proxy reconciler writes it to the Provisioned
	// condition instead of replacing the instance, and the pool replaces
	// the member under its disruption budget.
	ReasonBanned = "Banned"
	// ReasonBlockedOnHosts: the Banned condition's reason when True.
	ReasonBlockedOnHosts = "BlockedOnHosts"
	// ReasonNoCapacity and ReasonQuotaExceeded: the Provisioned reason of a
	// Proxy whose create the provider refused for want of capacity where
	// it asked (a full zone, no Spot capacity), or for an account or
	// project limit. Its pool places a successor elsewhere.
	ReasonNoCapacity    = "NoCapacity"
	ReasonQuotaExceeded = "QuotaExceeded"
)

// CurrentBan is the Banned condition when it is True about the instance
// the status records now, nil otherwise: a ban of a replaced instance is
// no ban of its successor.
func (p *Proxy) CurrentBan() *metav1.Condition {
	c := meta.FindStatusCondition(p.Status.Conditions, ConditionBanned)
	if c == nil || c.Status != metav1.ConditionTrue || p.Status.BannedInstance != p.Status.Instance() {
		return nil
	}
	return c
}

// BanPolicy is the proxy's ban recycling, resolved: its own
// spec.banRecycling, else its pool's (pool, nil for a stand-alone Proxy),
// else on for a pool member and off for a stand-alone Proxy. hosts 0 is
// off; External proxies are never recycled.
func (p *Proxy) BanPolicy(pool *ProxyPool) (hosts int, window time.Duration) {
	switch {
	case p.Spec.Mode != ModeManaged:
		return 0, 0
	case p.Spec.BanRecycling != nil:
		return p.Spec.BanRecycling.Resolved()
	case pool != nil:
		return pool.Spec.BanRecycling.Resolved()
	case p.PoolName() != "":
		return (*BanRecycling)(nil).Resolved()
	}
	return 0, 0
}

// PoolName is the name of the ProxyPool that controls the Proxy (its
// controller owner reference), "" for a stand-alone Proxy.
func (p *Proxy) PoolName() string {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "ProxyPool" || ref.APIVersion != GroupVersion.String() {
		return ""
	}
	return ref.Name
}

// Serving says whether a Proxy has an instance that runs as specified, with
// an address: what the health engine probes and discovery may hand out once
// it is also healthy. The one home of that rule.
func (p *Proxy) Serving() bool {
	return p.DeletionTimestamp.IsZero() && p.Status.Phase == PhaseReady && p.Status.IP != "" && p.Status.Port != 0
}

// Instance names the instance a Proxy's status records
// (<instanceName>/<specHash>@<ip>:<port>, or <ip>:<port> for an External
// proxy): it changes exactly when the proxy is replaced or moves, and a
// health verdict is about one.
func (s *ProxyStatus) Instance() string {
	address := net.JoinHostPort(s.IP, strconv.Itoa(int(s.Port)))
	if s.InstanceName == "" && s.SpecHash == "" {
		return address
	}
	return s.InstanceName + "/" + s.SpecHash + "@" + address
}

// RecordedHealth is the Healthy condition when it is a verdict about the
// instance the status records now, nil when there is none (or it is about
// another instance). A verdict that names no instance was written before
// verdicts named theirs, when every new address reset it: it is taken as
// about the instance recorded, until the health engine, which rewrites it
// with its instance as it starts, has done so.
func (p *Proxy) RecordedHealth() *metav1.Condition {
	c := meta.FindStatusCondition(p.Status.Conditions, ConditionHealthy)
	if c == nil || c.Status == metav1.ConditionUnknown {
		return nil
	}
	if named := p.Status.HealthCheckedInstance; named != "" && named != p.Status.Instance() {
		return nil
	}
	return c
}

// ReadyCondition is the one rule for Ready: a proxy is Ready when it
// serves (Serving), is Provisioned (a pool member failing its probes for
// too long is not, while it waits for its replacement) and healthy, the verdict about this very instance, is
// True. healthy is RecordedHealth, or a fresher verdict the caller holds
// (the health engine's, in memory); nil means none. The health engine
// writes the result as the Ready condition, discovery hands out exactly
// the proxies it makes Ready, and pools count them.
func (p *Proxy) ReadyCondition(healthy *metav1.Condition) metav1.Condition {
	ready := metav1.Condition{Type: ConditionReady, ObservedGeneration: p.Generation, Status: metav1.ConditionFalse}
	switch {
	case !p.Serving() || !meta.IsStatusConditionTrue(p.Status.Conditions, ConditionProvisioned):
		ready.Reason, ready.Message = ReasonNotProvisioned, "the instance is not running as specified (see the Provisioned condition)"
	case healthy == nil || healthy.Status == metav1.ConditionUnknown:
		ready.Reason, ready.Message = ReasonAwaitingProbe, "waiting for the first health verdict of this instance"
	case healthy.Status != metav1.ConditionTrue:
		ready.Reason, ready.Message = ReasonNotHealthy, healthy.Message
	default:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, ReasonProxyReady, "provisioned and healthy"
	}
	return ready
}

// IsReady says whether the Proxy is Ready by its recorded status (the rule
// of ReadyCondition, not the stored Ready condition, which follows its
// parts one write later).
func (p *Proxy) IsReady() bool {
	return p.ReadyCondition(p.RecordedHealth()).Status == metav1.ConditionTrue
}

// ExitIP is where sites see the proxy's requests come from: the egress IP
// the health engine learnt (status.egressIP), else its own address ("" while
// it has none).
func (p *Proxy) ExitIP() string {
	if p.Status.EgressIP != "" {
		return p.Status.EgressIP
	}
	return p.Status.IP
}

// ReasonExternal is the Provisioned reason of an External proxy: nothing
// is provisioned, the proxy runs elsewhere.
const ReasonExternal = "External"

// ExternalRecordMessage is an External proxy's status message.
const ExternalRecordMessage = "External proxy: not provisioned by the operator"

// ExternalPort is where an External proxy listens: spec.external.port, or
// spec.port when that is unset.
func (p *Proxy) ExternalPort() int32 {
	if p.Spec.External != nil && p.Spec.External.Port != 0 {
		return p.Spec.External.Port
	}
	return p.Spec.Port
}

// AsRecorded is p as its status reads once its provisioning is recorded.
// An External proxy has nothing to provision: its record (phase Ready, its
// spec's address, Provisioned) is what its spec says, and the health
// engine, the one writer of an External proxy's status, writes it with its
// first verdict, so one write brings the proxy up. Any other proxy is
// returned as it is: the reconciler records it.
func (p *Proxy) AsRecorded() *Proxy {
	if !p.recordedFromSpec() {
		return p
	}
	r := p.DeepCopy()
	r.Status.Phase, r.Status.Message, r.Status.ObservedGeneration = PhaseReady, ExternalRecordMessage, p.Generation
	r.Status.IP, r.Status.Port = p.Spec.External.Address, p.ExternalPort()
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ConditionProvisioned, Status: metav1.ConditionTrue,
		ObservedGeneration: p.Generation, Reason: ReasonExternal, Message: ExternalRecordMessage})
	return r
}

// ExternalRecordDiffers says whether an External proxy's stored record is
// not what AsRecorded says (never recorded, or its spec moved it).
func (p *Proxy) ExternalRecordDiffers() bool {
	if !p.recordedFromSpec() {
		return false
	}
	c := meta.FindStatusCondition(p.Status.Conditions, ConditionProvisioned)
	return p.Status.Phase != PhaseReady || p.Status.IP != p.Spec.External.Address || p.Status.Port != p.ExternalPort() ||
		p.Status.ObservedGeneration != p.Generation || c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonExternal
}

// recordedFromSpec says whether p's record is its spec's: an External
// proxy that is not being deleted.
func (p *Proxy) recordedFromSpec() bool {
	return p.Spec.Mode == ModeExternal && p.Spec.External != nil && p.DeletionTimestamp.IsZero()
}
