package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// execute performs action, records it in status (only when that changed)
// and says when to look again: the finalizer's two steps on their own,
// anything else as one provider call (act), the bookkeeping that follows
// it (keepRecord, note) and the status (recordStatus).
func (r *ProxyReconciler) execute(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, prov providers.Provider, a Action) (reconcile.Result, error) {
	switch a.Type {
	case ActionNothing:
		return reconcile.Result{}, nil
	case ActionAddFinalizer:
		return r.addFinalizer(ctx, p)
	case ActionRemoveFinalizer:
		return reconcile.Result{}, r.removeFinalizer(ctx, p, o, a)
	}
	a, result := r.act(ctx, p, o, prov, a)
	if err := r.keepRecord(ctx, p, o, a); err != nil {
		return reconcile.Result{}, err
	}
	result = r.note(ctx, p, o, a, result)
	if a.Quiet && a.Err == nil {
		logf.FromContext(ctx).V(1).Info("instance starting; nothing recorded until it runs", "action", a.Type, "instance", o.instanceName)
		return result, nil
	}
	if err := r.recordStatus(ctx, p, o, a); err != nil {
		return reconcile.Result{}, err
	}
	if a.Err != nil {
		// Transient: the workqueue's rate limiter backs off exponentially.
		return reconcile.Result{}, a.Err
	}
	return result, nil
}

// addFinalizer puts the instance-cleanup finalizer on p. Metadata-only
// changes do not pass the Proxy predicate, so it asks to look again now.
// The first status is the next pass's, with what it does: a "Pending"
// written here would be a write to say nothing.
func (r *ProxyReconciler) addFinalizer(ctx context.Context, p *crawlv1alpha1.Proxy) (reconcile.Result, error) {
	before := p.ResourceVersion
	controllerutil.AddFinalizer(p, crawlv1alpha1.Finalizer)
	if err := r.Client.Update(ctx, p); err != nil {
		return reconcile.Result{}, fmt.Errorf("adding finalizer: %w", err)
	}
	r.cache().tracker.Wrote(lagKey(lagProxy, client.ObjectKeyFromObject(p)), before, nil)
	return reconcile.Result{RequeueAfter: time.Millisecond}, nil
}

// removeFinalizer lets a Proxy whose instance is gone go.
func (r *ProxyReconciler) removeFinalizer(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, a Action) error {
	if err := r.deleteLegacyRecord(ctx, o.instanceName); err != nil {
		return err
	}
	controllerutil.RemoveFinalizer(p, crawlv1alpha1.Finalizer)
	if err := r.Client.Update(ctx, p); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, a.Reason, string(a.Type), a.Message)
	r.releaseReplacement(client.ObjectKeyFromObject(p))
	logf.FromContext(ctx).Info("finalizer removed", "reason", a.Reason)
	return nil
}

// act makes the one provider call a Create or Delete needs (a budgeted
// Delete only once admitted) and says when to look again. A call that
// fails, or a replacement held, turns a into what is recorded instead.
func (r *ProxyReconciler) act(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, prov providers.Provider, a Action) (Action, reconcile.Result) {
	poll := r.PollInterval
	if poll == 0 {
		poll = DefaultPollInterval
	}
	result := reconcile.Result{}
	switch a.Type {
	case ActionCreate:
		req := providers.CreateRequest{
			Proxy: p, Name: o.instanceName, CloudInit: o.cloudInit, SpecHash: o.desiredHash,
			Labels: instanceLabels(r.Owner, p, o.desiredHash), Credentials: o.credentials,
			Replaces: p.Status.HealthCheckedInstance,
		}
		if err := r.writeRecord(ctx, p, o); err != nil {
			return providerFailure(providers.Transient(err), crawlv1alpha1.PhaseProvisioning), result
		}
		if err := prov.Create(ctx, req); err != nil {
			return providerFailure(fmt.Errorf("creating instance %s: %w", o.instanceName, err), crawlv1alpha1.PhaseProvisioning), result
		}
		result.RequeueAfter = poll
	case ActionDelete:
		if a.Budgeted {
			if inFlight, admitted := r.admitReplacement(ctx, p, o); !admitted {
				logf.FromContext(ctx).Info("replacement held: provider busy", "provider", o.instanceProvider, "inFlight", inFlight, "bound", r.maxReplacements())
				replacementsHeld.WithLabelValues(o.instanceProvider, ReasonReplacementsBusy).Inc()
				return holdReplacement(a, o, r.maxReplacements()), result
			}
		}
		if err := prov.Delete(ctx, o.instance); err != nil {
			return providerFailure(fmt.Errorf("deleting instance %s: %w", o.instance.Name, err), a.Phase), result
		}
		result.RequeueAfter = poll
	case ActionWait:
		result.RequeueAfter = poll
	}
	return a, result
}

// keepRecord makes sure a running instance's credentials record is there
// (deleted by hand, or an instance made before shared records existed),
// and frees the place a replacement took once its successor runs.
func (r *ProxyReconciler) keepRecord(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, a Action) error {
	if a.Type != ActionMarkReady {
		return nil
	}
	if a.Reason == ReasonInstanceRunning {
		r.releaseReplacement(client.ObjectKeyFromObject(p))
	}
	if p.Spec.Mode != crawlv1alpha1.ModeManaged || o.instance.SpecHash() != o.desiredHash {
		return nil
	}
	current, err := r.recordCurrent(ctx, p, o)
	if err != nil || current {
		return err
	}
	if err := r.writeRecord(ctx, p, o); err != nil {
		return err
	}
	logf.FromContext(ctx).Info("credentials record written again for the running instance", "instance", o.instanceName)
	return nil
}

// note counts and logs what a deserves (a replacement, a held one) and
// brings the next look forward to a's recheck.
func (r *ProxyReconciler) note(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, a Action, result reconcile.Result) reconcile.Result {
	log := logf.FromContext(ctx)
	if a.Recheck > 0 && (result.RequeueAfter == 0 || a.Recheck < result.RequeueAfter) {
		result.RequeueAfter = a.Recheck
	}
	if a.Cause != "" && a.Err == nil {
		replacementsTotal.WithLabelValues(orProvider(o.instanceProvider, p.Spec.Provider), a.Cause).Inc()
		log.Info("replacing instance", "cause", a.Cause, "message", a.Message)
	}
	if a.Reason == ReasonProbeTargetSuspect {
		replacementsHeld.WithLabelValues(o.instanceProvider, a.Reason).Inc()
		if p.Status.Message != a.Message {
			log.Info("replacement held: suspecting the probe target", "url", o.health.URL,
				"unhealthy", o.health.Unhealthy, "probed", o.health.Probed)
		}
	}
	return result
}

// recordStatus applies the reconciler's part of the status a leaves, when
// it changed, and emits the Event a deserves. The action happened whether
// or not its record did (the Proxy deleted meanwhile, say): the Event
// tells people so either way, and the next pass records what it finds.
func (r *ProxyReconciler) recordStatus(ctx context.Context, p *crawlv1alpha1.Proxy, o observation, a Action) error {
	next := nextStatus(p, o, a)
	if equality.Semantic.DeepEqual(reconcilerPart(p.Status), reconcilerPart(next)) {
		return nil
	}
	previous, before := p.Status.Phase, p.ResourceVersion
	err := r.Client.Status().Apply(ctx, statusApply(p, next), client.FieldOwner(crawlv1alpha1.FieldManagerReconciler), client.ForceOwnership)
	if err == nil {
		r.cache().tracker.Wrote(lagKey(lagProxy, client.ObjectKeyFromObject(p)), before, nil)
	}
	if worthAnEvent(previous, a) {
		r.Recorder.Eventf(p, nil, eventType(a), a.Reason, string(a.Type), "%s", a.Message)
	}
	if err != nil {
		return fmt.Errorf("recording %s in status: %w", a.Type, err)
	}
	logf.FromContext(ctx).Info("status recorded", "action", a.Type, "phase", next.Phase, "reason", a.Reason)
	return nil
}

// worthAnEvent says whether a recorded action tells a person something the
// status does not already say at a glance: warnings, replacements,
// deletions, and a proxy back after a replacement. A proxy's routine
// bring-up (creating, provisioning, Ready for the first time) is in its
// status and printer columns; an Event for each step would cost two API
// writes per proxy and tell nobody anything.
func worthAnEvent(previous crawlv1alpha1.ProxyPhase, a Action) bool {
	switch {
	case eventType(a) == corev1.EventTypeWarning, a.Cause != "":
		return true
	case a.Type == ActionDelete, a.Type == ActionRemoveFinalizer:
		return true
	case a.Type == ActionMarkReady:
		return previous == crawlv1alpha1.PhaseReplacing
	}
	return false
}

// eventType is the type of the Event a deserves: Warning for a failure or
// a replacement of a sick or lost instance, Normal otherwise.
func eventType(a Action) string {
	switch {
	case a.Type == ActionFail, a.Err != nil:
		return corev1.EventTypeWarning
	}
	switch a.Reason {
	case ReasonInstanceFailed, ReasonInstanceLost, ReasonUnhealthy, ReasonStartupTimeout, ReasonBanned, ReasonBurnedIP, ReasonBurnedIPAccepted, ReasonBurnedIPUnknown, ReasonProbeTargetSuspect, ReasonReplacementsBusy, ReasonCredentialsError:
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}
