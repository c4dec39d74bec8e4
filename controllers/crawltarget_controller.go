package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// +kubebuilder:rbac:groups=crawl.example.com,resources=crawltargets,verbs=get;list;watch
// +kubebuilder:rbac:groups=crawl.example.com,resources=crawltargets/status,verbs=get;update;patch

// CrawlTargetReconciler writes each CrawlTarget's Accepted condition:
// whether it is the policy in force for its host in its namespace, by the
// one precedence rule discovery applies too (CrawlTarget.Precedes).
// Discovery reads CrawlTargets from the cache itself; this only tells
// their authors.
type CrawlTargetReconciler struct {
	Client client.Client
}

// SetupWithManager watches CrawlTargets; a change to one looks again at
// every CrawlTarget of its namespace, since it may win or lose against
// them.
func (r *CrawlTargetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	siblings := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var list crawlv1alpha1.CrawlTargetList
		if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
		return out
	})
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("crawltarget").
		For(&crawlv1alpha1.CrawlTarget{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&crawlv1alpha1.CrawlTarget{}, siblings, builder.WithPredicates(predicate.Funcs{
			// A new or deleted sibling, or one whose host changed, may
			// change who wins.
			UpdateFunc: func(e event.UpdateEvent) bool { return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() },
		})).
		Complete(r); err != nil {
		return fmt.Errorf("building the CrawlTarget controller: %w", err)
	}
	return nil
}

// Reconcile writes one CrawlTarget's Accepted condition when it changed.
func (r *CrawlTargetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ct crawlv1alpha1.CrawlTarget
	if err := r.Client.Get(ctx, req.NamespacedName, &ct); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var list crawlv1alpha1.CrawlTargetList
	if err := r.Client.List(ctx, &list, client.InNamespace(ct.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the CrawlTargets of %s: %w", ct.Namespace, err)
	}
	next := ct.Status.DeepCopy()
	meta.SetStatusCondition(&next.Conditions, acceptance(&ct, list.Items))
	if equality.Semantic.DeepEqual(ct.Status, *next) {
		return ctrl.Result{}, nil
	}
	accepted := meta.FindStatusCondition(next.Conditions, crawlv1alpha1.ConditionAccepted)
	apply := acv1alpha1.CrawlTarget(ct.Name, ct.Namespace).
		WithStatus(acv1alpha1.CrawlTargetStatus().WithConditions(crawlv1alpha1.ConditionApply(*accepted)))
	if err := r.Client.Status().Apply(ctx, apply, client.FieldOwner(crawlv1alpha1.FieldManagerCrawlTarget), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("writing the status of CrawlTarget %s: %w", req.NamespacedName, err)
	}
	return ctrl.Result{}, nil
}

// acceptance is ct's Accepted condition among its namespace's CrawlTargets:
// False with reason Conflict when another one naming the same host
// precedes it.
func acceptance(ct *crawlv1alpha1.CrawlTarget, namespace []crawlv1alpha1.CrawlTarget) metav1.Condition {
	cond := metav1.Condition{Type: crawlv1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, ObservedGeneration: ct.Generation,
		Reason: crawlv1alpha1.ReasonAccepted, Message: fmt.Sprintf("discovery and the gateway pace %s by this policy", ct.Spec.Host)}
	winner := ct
	for i := range namespace {
		other := &namespace[i]
		if other.Name != ct.Name && other.Spec.Host == ct.Spec.Host && other.DeletionTimestamp.IsZero() && other.Precedes(winner) {
			winner = other
		}
	}
	if winner != ct {
		cond.Status, cond.Reason = metav1.ConditionFalse, crawlv1alpha1.ReasonConflict
		cond.Message = fmt.Sprintf("CrawlTarget %s is older and names the same host %s: it is in force, this one is not (the oldest wins, then the first by name)", winner.Name, ct.Spec.Host)
	}
	return cond
}
