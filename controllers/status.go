package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// nextStatus is the status a Proxy has once action is done. It is pure; the
// executor writes the result only when it differs from the current status,
// so a pass that changes nothing writes nothing.
func nextStatus(p *crawlv1alpha1.Proxy, o observation, a Action) crawlv1alpha1.ProxyStatus {
	s := *p.Status.DeepCopy()
	s.ObservedGeneration = p.Generation
	if a.Phase != "" {
		s.Phase = a.Phase
	}
	s.Message = a.Message

	provisioned := metav1.ConditionFalse
	switch a.Type {
	case ActionMarkReady:
		provisioned = metav1.ConditionTrue
		if p.Spec.Mode == crawlv1alpha1.ModeExternal {
			s.IP, s.Port = p.Spec.External.Address, externalPort(p)
			s.InstanceName, s.Provider, s.SpecHash = "", "", ""
		} else {
			s.IP, s.Port = o.instance.IP, o.instance.Port
			s.InstanceName, s.Provider, s.SpecHash = o.instance.Name, p.Spec.Provider, o.instance.SpecHash()
		}
		if meta.FindStatusCondition(s.Conditions, crawlv1alpha1.ConditionHealthy) == nil {
			setHealthUnknown(&s, p.Generation)
		}
	case ActionCreate:
		// Recorded before the instance runs, so a crash after this write still
		// knows which provider holds it.
		s.IP, s.Port = "", 0
		s.InstanceName, s.Provider, s.SpecHash = o.instanceName, p.Spec.Provider, o.desiredHash
		setHealthUnknown(&s, p.Generation)
	case ActionDelete:
		// The address is going away: stop advertising it now.
		s.IP, s.Port = "", 0
		setHealthUnknown(&s, p.Generation)
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               crawlv1alpha1.ConditionProvisioned,
		Status:             provisioned,
		ObservedGeneration: p.Generation,
		Reason:             a.Reason,
		Message:            truncate(a.Message),
	})
	s.SetReadyCondition(p.Generation)
	return s
}

// setHealthUnknown resets the health verdict: a new or replaced instance
// starts from a clean slate.
func setHealthUnknown(s *crawlv1alpha1.ProxyStatus, generation int64) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               crawlv1alpha1.ConditionHealthy,
		Status:             metav1.ConditionUnknown,
		ObservedGeneration: generation,
		Reason:             crawlv1alpha1.ReasonAwaitingProbe,
		Message:            "no health verdict for this instance yet",
	})
}

// externalPort is where an External proxy listens: spec.external.port, or
// spec.port when that is unset.
func externalPort(p *crawlv1alpha1.Proxy) int32 {
	if p.Spec.External.Port != 0 {
		return p.Spec.External.Port
	}
	return p.Spec.Port
}

// maxConditionMessage is metav1.Condition's message limit.
const maxConditionMessage = 32768

func truncate(msg string) string {
	if len(msg) > maxConditionMessage {
		return msg[:maxConditionMessage-3] + "..."
	}
	return msg
}
