package pool

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// applyStatus applies s as the pool's status (server-side apply, field
// manager crawlv1alpha1.FieldManagerPool, the status's only writer). Every
// field is sent, zeros included: a field left out would stay as an
// earlier writer (a release that patched status) recorded it.
func (r *Reconciler) applyStatus(ctx context.Context, pool *crawlv1alpha1.ProxyPool, s crawlv1alpha1.ProxyPoolStatus) error {
	status := acv1alpha1.ProxyPoolStatus().
		WithReplicas(s.Replicas).WithReadyReplicas(s.ReadyReplicas).WithAvailableReplicas(s.AvailableReplicas).
		WithUpdatedReplicas(s.UpdatedReplicas).WithRecycling(s.Recycling).
		WithSelector(s.Selector).WithTemplateHash(s.TemplateHash).WithObservedGeneration(s.ObservedGeneration)
	if a := s.Autoscaling; a != nil {
		as := acv1alpha1.PoolAutoscalingStatus().WithDesiredReplicas(a.DesiredReplicas).WithActiveLeases(a.ActiveLeases)
		if a.LastHighDemandTime != nil {
			as.WithLastHighDemandTime(*a.LastHighDemandTime)
		}
		if a.LastScaleTime != nil {
			as.WithLastScaleTime(*a.LastScaleTime)
		}
		status.WithAutoscaling(as)
	}
	for _, c := range s.Conditions {
		status.WithConditions(crawlv1alpha1.ConditionApply(c))
	}
	apply := acv1alpha1.ProxyPool(pool.Name, pool.Namespace).WithStatus(status)
	if err := r.Client.Status().Apply(ctx, apply, client.FieldOwner(crawlv1alpha1.FieldManagerPool), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the status of ProxyPool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	pool.Status = s
	return nil
}

// writeStatus records decide's counts and the conditions they imply.
func writeStatus(s *crawlv1alpha1.ProxyPoolStatus, pool *crawlv1alpha1.ProxyPool, d Decision, hash string) {
	s.Replicas, s.ReadyReplicas, s.AvailableReplicas = int32(d.Replicas), int32(d.Ready), int32(d.Available)
	s.UpdatedReplicas, s.Recycling = int32(d.Updated), int32(d.Recycling)
	s.Selector, s.TemplateHash, s.ObservedGeneration = Selector(pool), hash, pool.Generation
	if d.Available >= d.MinAvailable {
		setCondition(s, pool.Generation, crawlv1alpha1.ConditionAvailable, metav1.ConditionTrue, "MinimumMembersAvailable",
			fmt.Sprintf("%d members available, at least the floor of %d (replicas - maxUnavailable)", d.Available, d.MinAvailable))
	} else {
		setCondition(s, pool.Generation, crawlv1alpha1.ConditionAvailable, metav1.ConditionFalse, "MinimumMembersUnavailable",
			fmt.Sprintf("%d members available, below the floor of %d (replicas - maxUnavailable)", d.Available, d.MinAvailable))
	}
	if d.Settled {
		setCondition(s, pool.Generation, crawlv1alpha1.ConditionProgressing, metav1.ConditionTrue, "PoolSettled",
			"every member is made from the current template, available, and within its zone's share")
		return
	}
	var parts []string
	if n := ptr.Deref(pool.Spec.Replicas, 1) - int32(d.Updated); n > 0 {
		parts = append(parts, fmt.Sprintf("%d members still to make from the current template", n))
	}
	if d.Recycling > 0 {
		parts = append(parts, fmt.Sprintf("%d being replaced", d.Recycling))
	}
	if d.Deleting > 0 {
		parts = append(parts, fmt.Sprintf("%d being deleted", d.Deleting))
	}
	if d.Available < d.Replicas {
		parts = append(parts, fmt.Sprintf("%d of %d not available yet", d.Replicas-d.Available, d.Replicas))
	}
	if len(parts) == 0 {
		parts = append(parts, "scaling")
	}
	setCondition(s, pool.Generation, crawlv1alpha1.ConditionProgressing, metav1.ConditionTrue, "MembersChanging", strings.Join(parts, "; "))
}

func setCondition(s *crawlv1alpha1.ProxyPoolStatus, generation int64, typ string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: generation})
}
