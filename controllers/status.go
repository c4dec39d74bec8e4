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

	// Whatever record an earlier pass lost (a conflict, a crash), the
	// instance this pass saw is recorded: its name, where it lives and the
	// spec it was made from, so deletion always knows what to wait for.
	if o.instance != nil {
		s.InstanceName, s.Provider, s.SpecHash = o.instance.Name, o.instanceProvider, o.instance.SpecHash()
	}

	provisioned := metav1.ConditionFalse
	switch a.Type {
	case ActionMarkReady:
		provisioned = metav1.ConditionTrue
		ip, port := "", int32(0)
		if p.Spec.Mode == crawlv1alpha1.ModeExternal {
			ip, port = p.Spec.External.Address, externalPort(p)
			s.InstanceName, s.Provider, s.SpecHash = "", "", ""
		} else {
			ip, port = o.instance.IP, o.instance.Port
		}
		// A new address is a proxy nobody has probed: its verdict starts
		// again, so it is never served on the old address's record.
		if ip != s.IP || port != s.Port || meta.FindStatusCondition(s.Conditions, crawlv1alpha1.ConditionHealthy) == nil {
			setHealthUnknown(&s, p.Generation)
		}
		s.IP, s.Port = ip, port
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

// awaitsFirstVerdict says whether next records an address (or instance)
// nobody has probed, where current did not: next is serving, its verdict
// is reset to Unknown, and current had no verdict or another address. The
// executor then has the address probed before it writes anything.
func awaitsFirstVerdict(current, next crawlv1alpha1.ProxyStatus) bool {
	if next.Phase != crawlv1alpha1.PhaseReady || next.IP == "" || next.Port == 0 {
		return false
	}
	healthy := meta.FindStatusCondition(next.Conditions, crawlv1alpha1.ConditionHealthy)
	if healthy == nil || healthy.Status != metav1.ConditionUnknown {
		return false
	}
	was := meta.FindStatusCondition(current.Conditions, crawlv1alpha1.ConditionHealthy)
	return was == nil || was.Status != metav1.ConditionUnknown ||
		current.IP != next.IP || current.Port != next.Port ||
		current.InstanceName != next.InstanceName || current.SpecHash != next.SpecHash
}

// withFirstVerdict is next with the verdict of the probe ahead of it: a
// passing one is recorded as the engine would record it (the Healthy
// condition, lastHealthCheckTime, Ready derived); anything else leaves the
// verdict awaited, for the engine to record.
func withFirstVerdict(next crawlv1alpha1.ProxyStatus, first FirstVerdict, generation int64) crawlv1alpha1.ProxyStatus {
	if first.Healthy == nil {
		return next
	}
	s := *next.DeepCopy()
	healthy := *first.Healthy
	healthy.ObservedGeneration = generation
	meta.SetStatusCondition(&s.Conditions, healthy)
	at := metav1.NewTime(first.At)
	s.LastHealthCheckTime = &at
	s.SetReadyCondition(generation)
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
