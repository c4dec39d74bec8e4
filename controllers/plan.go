package controllers

import (
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// ActionType names the one thing a reconcile pass does.
type ActionType string

// The complete set of actions. Each pass performs exactly one.
const (
	ActionAddFinalizer    ActionType = "AddFinalizer"
	ActionFail            ActionType = "Fail"
	ActionCreate          ActionType = "Create"
	ActionWait            ActionType = "WaitForInstance"
	ActionDelete          ActionType = "Delete"
	ActionMarkReady       ActionType = "MarkReady"
	ActionRemoveFinalizer ActionType = "RemoveFinalizer"
	ActionNothing         ActionType = "Nothing"
)

// Action is plan's decision: what to do, and the words for the status and
// the Event that record it.
type Action struct {
	Type ActionType
	// Phase the Proxy is in once the action is done (empty: unchanged).
	Phase crawlv1alpha1.ProxyPhase
	// Reason is a CamelCase word for the Provisioned condition and the Event.
	Reason string
	// Message tells a user what is happening, and what to do if it is stuck.
	Message string
	// Err, on a Wait, is the transient error to retry with backoff.
	Err error
}

// Reasons used in conditions and Events.
const (
	ReasonCreating          = "Creating"
	ReasonProvisioning      = "Provisioning"
	ReasonInstanceRunning   = "InstanceRunning"
	ReasonSpecChanged       = "SpecChanged"
	ReasonInstanceFailed    = "InstanceFailed"
	ReasonStaleInstance     = "StaleInstance"
	ReasonInstanceStopping  = "InstanceStopping"
	ReasonDeleting          = "Deleting"
	ReasonProviderNotFound  = "ProviderNotFound"
	ReasonProviderError     = "ProviderError"
	ReasonInvalidPlacement  = "InvalidPlacement"
	ReasonCloudInitError    = "CloudInitError"
	ReasonExternal          = "External"
	ReasonFinalizerAdded    = "FinalizerAdded"
	ReasonInstanceDeleted   = "InstanceDeleted"
	ReasonProviderTransient = "ProviderUnavailable"
)

// specError says why the spec cannot be realised as it stands: a reason for
// the condition and a message naming what to change.
type specError struct {
	reason, message string
}

func (e *specError) Error() string { return e.reason + ": " + e.message }

// observation is everything plan decides from: the Proxy, the hash of its
// current spec, and what the provider said.
type observation struct {
	proxy *crawlv1alpha1.Proxy
	// instanceName is the deterministic instance name for this Proxy.
	instanceName string
	// cloudInit is the resolved cloud-init document.
	cloudInit string
	// desiredHash is the hash of the replacement-forcing spec fields; empty
	// when specErr is set or the Proxy is being deleted.
	desiredHash string
	// specErr is why the spec cannot be realised; for a Proxy being deleted
	// only a missing provider is reported (nothing else matters then).
	specErr *specError
	// instance is what Get returned; nil when it said not found.
	instance *providers.Instance
	// getErr is Get's error other than not found.
	getErr error
}

// plan maps an observation to exactly one action. It is pure: no I/O, no
// clock, so every case is a table row in plan_test.go.
func plan(o observation) Action {
	p := o.proxy
	deleting := !p.DeletionTimestamp.IsZero()
	hasFinalizer := controllerutil.ContainsFinalizer(p, crawlv1alpha1.Finalizer)

	if p.Spec.Mode == crawlv1alpha1.ModeExternal {
		switch {
		case deleting && hasFinalizer:
			return Action{Type: ActionRemoveFinalizer, Reason: ReasonDeleting, Message: "External proxy has no instance to delete"}
		case deleting:
			return Action{Type: ActionNothing}
		}
		return Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonExternal,
			Message: "External proxy: not provisioned by the operator"}
	}

	switch {
	case deleting && !hasFinalizer:
		return Action{Type: ActionNothing}
	case deleting:
		return planDeletion(o)
	case !hasFinalizer:
		return Action{Type: ActionAddFinalizer, Phase: phaseOr(p.Status.Phase, crawlv1alpha1.PhasePending),
			Reason: ReasonFinalizerAdded, Message: "waiting to provision"}
	case o.specErr != nil:
		return fail(o.specErr.reason, o.specErr.message)
	case o.getErr != nil:
		return providerFailure(o.getErr, crawlv1alpha1.PhaseProvisioning)
	case o.instance == nil:
		return Action{Type: ActionCreate, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonCreating,
			Message: fmt.Sprintf("creating instance %s with provider %s", o.instanceName, p.Spec.Provider)}
	}

	inst := o.instance
	switch {
	case inst.State == providers.StateStopping:
		return Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceStopping,
			Message: fmt.Sprintf("waiting for instance %s to be deleted before creating its replacement", inst.Name)}
	case inst.OwnerUID() != string(p.UID):
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonStaleInstance,
			Message: fmt.Sprintf("instance %s belongs to an earlier Proxy of the same name (uid %q); deleting it", inst.Name, inst.OwnerUID())}
	case inst.SpecHash() != o.desiredHash:
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonSpecChanged,
			Message: fmt.Sprintf("spec changed (hash %s, instance has %s): replacing instance %s; it will come back with a new IP", o.desiredHash, inst.SpecHash(), inst.Name)}
	case inst.State == providers.StateFailed:
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceFailed,
			Message: fmt.Sprintf("instance %s stopped (%s): replacing it", inst.Name, orUnknown(inst.Message))}
	case inst.State == providers.StatePending:
		return Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonProvisioning,
			Message: fmt.Sprintf("instance %s is starting: %s", inst.Name, orUnknown(inst.Message))}
	}
	return Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonInstanceRunning,
		Message: fmt.Sprintf("instance %s is running at %s:%d", inst.Name, inst.IP, inst.Port)}
}

// planDeletion keeps the finalizer until the provider confirms the instance
// is gone, so deleting a Proxy never leaks an instance.
func planDeletion(o observation) Action {
	p := o.proxy
	switch {
	case o.specErr != nil && p.Status.InstanceName == "":
		// The provider cannot be reached, but nothing was ever recorded as
		// created through it: there is nothing to wait for.
		return Action{Type: ActionRemoveFinalizer, Reason: ReasonInstanceDeleted,
			Message: "no instance was recorded for this Proxy"}
	case o.specErr != nil:
		return fail(o.specErr.reason, fmt.Sprintf("cannot delete instance %s: %s; restore the provider, or remove the finalizer %s by hand once the instance is gone",
			p.Status.InstanceName, o.specErr.message, crawlv1alpha1.Finalizer))
	case o.getErr != nil:
		return providerFailure(o.getErr, crawlv1alpha1.PhaseDeleting)
	case o.instance == nil:
		return Action{Type: ActionRemoveFinalizer, Reason: ReasonInstanceDeleted,
			Message: fmt.Sprintf("instance %s is gone", o.instanceName)}
	case o.instance.State == providers.StateStopping:
		return Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseDeleting, Reason: ReasonDeleting,
			Message: fmt.Sprintf("waiting for instance %s to be deleted", o.instance.Name)}
	}
	return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseDeleting, Reason: ReasonDeleting,
		Message: fmt.Sprintf("deleting instance %s", o.instance.Name)}
}

// providerFailure turns a provider error into a Wait (transient: retried
// with backoff) or a Fail (terminal or unknown: retrying cannot help).
func providerFailure(err error, phase crawlv1alpha1.ProxyPhase) Action {
	if errors.Is(err, providers.ErrTransient) {
		return Action{Type: ActionWait, Phase: phase, Reason: ReasonProviderTransient,
			Message: fmt.Sprintf("provider unavailable, retrying: %v", err), Err: err}
	}
	if errors.Is(err, providers.ErrTerminal) {
		return fail(ReasonProviderError, providers.TerminalMessage(err))
	}
	// An error of no known kind is retried: failing a Proxy on a bug or a
	// network blip would need a human to recover it.
	return Action{Type: ActionWait, Phase: phase, Reason: ReasonProviderError,
		Message: fmt.Sprintf("provider error, retrying: %v", err), Err: err}
}

func fail(reason, message string) Action {
	return Action{Type: ActionFail, Phase: crawlv1alpha1.PhaseFailed, Reason: reason, Message: message}
}

func phaseOr(phase, fallback crawlv1alpha1.ProxyPhase) crawlv1alpha1.ProxyPhase {
	if phase == "" {
		return fallback
	}
	return phase
}

func orUnknown(s string) string {
	if s == "" {
		return "no detail from the provider"
	}
	return s
}
