package pool

import (
	"context"
	"fmt"

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
