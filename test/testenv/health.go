package testenv

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// ApplyHealth plays the health engine for tests that run without one: it
// applies, as the engine's field manager, a verdict about the instance p's
// status records (healthy True or False), with Ready by the API's rule, so
// the reconciler's fields stay the reconciler's.
func ApplyHealth(ctx context.Context, c client.Client, p *crawlv1alpha1.Proxy, healthy metav1.ConditionStatus, reason, message string) error {
	now := metav1.NewTime(time.Now()).Rfc3339Copy()
	cond := metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: healthy, Reason: reason, Message: message,
		ObservedGeneration: p.Generation, LastTransitionTime: now}
	if old := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy); old != nil && old.Status == healthy {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	judged := p.DeepCopy()
	judged.Status.HealthCheckedInstance = p.Status.Instance()
	meta.SetStatusCondition(&judged.Status.Conditions, cond)
	ready := judged.ReadyCondition(judged.RecordedHealth())
	ready.LastTransitionTime = now
	apply := acv1alpha1.Proxy(p.Name, p.Namespace).WithStatus(acv1alpha1.ProxyStatus().
		WithConditions(crawlv1alpha1.ConditionApply(cond), crawlv1alpha1.ConditionApply(ready)).
		WithHealthCheckedInstance(judged.Status.HealthCheckedInstance).
		WithLastHealthCheckTime(now))
	return c.Status().Apply(ctx, apply, client.FieldOwner(crawlv1alpha1.FieldManagerHealth), client.ForceOwnership)
}

// SetHealth gives p, in memory, a verdict about the instance its status
// records, Ready by the rule, and the Provisioned condition a serving
// proxy has: the status
// a tested view (discovery, the gateway, the client) reads of a proxy the
// operator brought up.
func SetHealth(p *crawlv1alpha1.Proxy, healthy metav1.ConditionStatus, reason string) {
	if meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned) == nil {
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "InstanceRunning"})
	}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: healthy, Reason: reason})
	p.Status.HealthCheckedInstance = p.Status.Instance()
	meta.SetStatusCondition(&p.Status.Conditions, p.ReadyCondition(p.RecordedHealth()))
}
