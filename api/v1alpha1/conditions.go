package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of the Healthy and Ready conditions that both the reconciler and
// the health engine write.
const (
	// ReasonAwaitingProbe: a new or replaced instance has no verdict yet.
	ReasonAwaitingProbe = "AwaitingProbe"
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
)

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

// SetReadyCondition derives Ready from Provisioned and Healthy: a proxy may
// be handed out only when both are True. The reconciler and the health
// engine each call it after changing their own condition, so Ready never
// disagrees with its parts.
func (s *ProxyStatus) SetReadyCondition(generation int64) {
	ready := metav1.Condition{Type: ConditionReady, ObservedGeneration: generation}
	provisioned := meta.FindStatusCondition(s.Conditions, ConditionProvisioned)
	healthy := meta.FindStatusCondition(s.Conditions, ConditionHealthy)
	switch {
	case provisioned == nil || provisioned.Status != metav1.ConditionTrue:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonNotProvisioned, "the instance is not running as specified"
		if provisioned != nil && provisioned.Message != "" {
			ready.Message = provisioned.Message
		}
	case healthy == nil || healthy.Status == metav1.ConditionUnknown:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonAwaitingProbe, "waiting for the first health verdict"
	case healthy.Status != metav1.ConditionTrue:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonNotHealthy, healthy.Message
	default:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, ReasonProxyReady, "provisioned and healthy"
	}
	meta.SetStatusCondition(&s.Conditions, ready)
}
