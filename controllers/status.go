package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// nextStatus is the status a Proxy has once action is done, in the fields
// the reconciler owns (reconcilerPart); the health engine's are p's. It is
// pure; the executor applies the result only when the reconciler's part
// differs from the current one, so a pass that changes nothing writes
// nothing.
func nextStatus(p *crawlv1alpha1.Proxy, o observation, a Action) crawlv1alpha1.ProxyStatus {
	s := *p.Status.DeepCopy()
	s.ObservedGeneration = p.Generation
	if a.Phase != "" {
		s.Phase = a.Phase
	}
	s.Message = a.Message

	// Whatever record an earlier pass lost (a crash), the instance this
	// pass saw is recorded: its name, where it lives and the spec it was
	// made from, so deletion always knows what to wait for.
	if o.instance != nil {
		s.InstanceName, s.Provider, s.SpecHash = o.instance.Name, o.instanceProvider, o.instance.SpecHash()
	}

	provisioned := metav1.ConditionFalse
	switch a.Type {
	case ActionMarkReady:
		provisioned = metav1.ConditionTrue
		s.IP, s.Port = o.instance.IP, o.instance.Port
		s.IPv6Prefix, s.SessionAddresses = o.instance.IPv6Prefix, o.instance.SessionAddresses
	case ActionCreate:
		// Recorded before the instance runs, so a crash after this write still
		// knows which provider holds it.
		s.IP, s.Port, s.IPv6Prefix, s.SessionAddresses = "", 0, "", 0
		s.InstanceName, s.Provider, s.SpecHash = o.instanceName, p.Spec.Provider, o.desiredHash
	case ActionDelete:
		// The addresses are going away: stop advertising them now.
		s.IP, s.Port, s.IPv6Prefix, s.SessionAddresses = "", 0, "", 0
	}
	switch {
	case a.Cause == ReasonBurnedIP:
		s.BurnedIPRerolls++
	case a.Type == ActionMarkReady:
		s.BurnedIPRerolls = 0
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               crawlv1alpha1.ConditionProvisioned,
		Status:             provisioned,
		ObservedGeneration: p.Generation,
		Reason:             a.Reason,
		Message:            truncate(a.Message),
	})
	return s
}

// reconcilerPart is s with only the fields the reconciler owns: what it
// compares before it applies, and what it applies.
func reconcilerPart(s crawlv1alpha1.ProxyStatus) crawlv1alpha1.ProxyStatus {
	part := crawlv1alpha1.ProxyStatus{
		Phase: s.Phase, Message: s.Message, ObservedGeneration: s.ObservedGeneration,
		IP: s.IP, Port: s.Port, IPv6Prefix: s.IPv6Prefix, SessionAddresses: s.SessionAddresses, InstanceName: s.InstanceName, Provider: s.Provider, SpecHash: s.SpecHash,
		BurnedIPRerolls: s.BurnedIPRerolls,
	}
	if c := meta.FindStatusCondition(s.Conditions, crawlv1alpha1.ConditionProvisioned); c != nil {
		part.Conditions = []metav1.Condition{*c}
	}
	return part
}

// statusApply is the reconciler's part of s as an apply configuration
// (field manager crawlv1alpha1.FieldManagerReconciler). Empty fields are
// sent too: applying "" is what clears an address the reconciler, or the
// Update-based writer of earlier releases, recorded.
func statusApply(p *crawlv1alpha1.Proxy, s crawlv1alpha1.ProxyStatus) *acv1alpha1.ProxyApplyConfiguration {
	part := reconcilerPart(s)
	status := acv1alpha1.ProxyStatus().
		WithPhase(part.Phase).WithMessage(part.Message).WithObservedGeneration(part.ObservedGeneration).
		WithIP(part.IP).WithPort(part.Port).WithIPv6Prefix(part.IPv6Prefix).WithSessionAddresses(part.SessionAddresses).
		WithInstanceName(part.InstanceName).WithProvider(part.Provider).WithSpecHash(part.SpecHash).
		WithBurnedIPRerolls(part.BurnedIPRerolls)
	for _, c := range part.Conditions {
		status.WithConditions(crawlv1alpha1.ConditionApply(c))
	}
	return acv1alpha1.Proxy(p.Name, p.Namespace).WithStatus(status)
}

// maxConditionMessage is metav1.Condition's message limit.
const maxConditionMessage = 32768

func truncate(msg string) string {
	if len(msg) > maxConditionMessage {
		return msg[:maxConditionMessage-3] + "..."
	}
	return msg
}
