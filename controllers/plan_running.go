package controllers

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// The plan for a Proxy whose instance runs or is going away: keep it,
// replace it (budgeted), or delete it; and how failures are recorded.

// planRunning decides for an instance that runs as specified: it serves,
// unless it has failed its probes for longer than the replacement period.
func planRunning(o observation) Action {
	inst := o.instance
	ready := Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonInstanceRunning,
		Message: fmt.Sprintf("instance %s is running at %s:%d", inst.Name, inst.IP, inst.Port)}
	p := o.proxy
	switch {
	case o.burnedErr != nil:
		// Asked again at the next poll, not after a growing backoff: the
		// store is usually back within seconds, and the instance serves
		// nobody until it answers.
		return Action{Type: ActionWait, Phase: phaseWhileStarting(p), Reason: ReasonBurnedIPUnknown,
			Message: fmt.Sprintf("instance %s runs at %s, but the burned-IP memory did not answer: waiting for it before serving: %v", inst.Name, inst.IP, o.burnedErr)}
	case !o.burnedUntil.IsZero() && int(p.Status.BurnedIPRerolls) < o.maxRerolls:
		// Not budgeted: it serves nobody yet.
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonBurnedIP, Cause: ReasonBurnedIP,
			Message: fmt.Sprintf("instance %s came up on %s, an exit IP retired for bans (remembered until %s): replacing it before it serves (reroll %d of at most %d)",
				inst.Name, inst.IP, o.burnedUntil.UTC().Format(time.RFC3339), p.Status.BurnedIPRerolls+1, o.maxRerolls)}
	case !o.burnedUntil.IsZero():
		ready.Reason = ReasonBurnedIPAccepted
		ready.Message = fmt.Sprintf("instance %s is running at %s:%d, an exit IP retired for bans, after %d rerolls (the most allowed): serving it",
			inst.Name, inst.IP, inst.Port, p.Status.BurnedIPRerolls)
		return ready
	case o.ban != nil && o.pool != "":
		// A member is not replaced in place: its pool surges a successor
		// and retires it under the pool's budget.
		ready.Reason = ReasonBanned
		ready.Message = fmt.Sprintf("instance %s is banned (%s): ProxyPool %s replaces this member", inst.Name, o.ban.Message, o.pool)
		return ready
	case o.ban != nil:
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonBanned, Cause: ReasonBanned, Budgeted: true,
			Message: fmt.Sprintf("instance %s is banned (%s): replacing it; it will come back with a new IP", inst.Name, o.ban.Message)}
	}
	after := o.replacement.After
	switch {
	case after <= 0:
		return ready
	case o.health == nil:
		// The engine has not taken the proxy up yet (right after an
		// operator restart it starts from the status, a moment after this
		// pass may run) and its verdict will not change to tell us: if the
		// status says Unhealthy, look again once the engine knows.
		if meta.IsStatusConditionFalse(o.proxy.Status.Conditions, crawlv1alpha1.ConditionHealthy) {
			ready.Recheck = o.replacement.heldRecheck()
		}
		return ready
	case o.health.UnhealthySince.IsZero():
		return ready
	}
	h := o.health
	if targetSuspect(h.Unhealthy, h.Probed, o.replacement.MaxUnhealthyShare) {
		if o.now.Sub(h.UnhealthySince) < after {
			ready.Recheck = o.replacement.heldRecheck()
			return ready
		}
		ready.Reason = ReasonProbeTargetSuspect
		// No counts in the message: it is written to status, and must not
		// change with every verdict of a fleet in an outage.
		ready.Message = fmt.Sprintf("instance %s has been Unhealthy for longer than %s, but so are more than %.0f%% of the Managed proxies probed against %s: suspecting the probe target, not the proxies; replacing none",
			inst.Name, after, 100*o.replacement.MaxUnhealthyShare, h.URL)
		ready.Recheck = o.replacement.heldRecheck()
		return ready
	}
	// As a fleet recovers from an outage the share falls below the bound
	// before the last proxies are probed again: their time Unhealthy counts
	// only from the end of the suspicion, so they are not replaced for it.
	since := h.UnhealthySince
	if h.LastSuspect.After(since) {
		since = h.LastSuspect
	}
	unhealthyFor := o.now.Sub(since)
	if unhealthyFor < after {
		ready.Recheck = after - unhealthyFor
		return ready
	}
	if o.pool != "" {
		// A member is not replaced in place: its pool surges a successor
		// and retires it under the pool's budget. No duration in the
		// message: it is written to status, and must not change per pass.
		ready.Reason = ReasonUnhealthy
		ready.Message = fmt.Sprintf("instance %s has been Unhealthy for longer than %s: ProxyPool %s replaces this member", inst.Name, after, o.pool)
		ready.Recheck = o.replacement.heldRecheck()
		return ready
	}
	return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonUnhealthy, Cause: ReasonUnhealthy, Budgeted: true,
		Message: fmt.Sprintf("instance %s has been Unhealthy for %s (longer than %s): replacing it; it will come back with a new IP",
			inst.Name, unhealthyFor.Round(time.Second), after)}
}

// holdReplacement is what a budgeted replacement becomes when the provider
// instance has its bound of replacements in flight: the proxy stays as it
// is, and is looked at again soon.
func holdReplacement(a Action, o observation, bound int) Action {
	return Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonReplacementsBusy, Recheck: o.replacement.heldRecheck(),
		Message: fmt.Sprintf("replacement waits (%s): provider %s has its %d replacements in flight; instance %s keeps running meanwhile",
			a.Reason, o.instanceProvider, bound, o.instance.Name)}
}

// phaseWhileStarting keeps a replacement Replacing until its new instance
// runs, so replacements in flight can be counted by phase.
func phaseWhileStarting(p *crawlv1alpha1.Proxy) crawlv1alpha1.ProxyPhase {
	if p.Status.Phase == crawlv1alpha1.PhaseReplacing {
		return crawlv1alpha1.PhaseReplacing
	}
	return crawlv1alpha1.PhaseProvisioning
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
		// observe has looked by name and, when status recorded nothing, by
		// owner UID in every provider: no instance of this Proxy exists.
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
	switch {
	case errors.Is(err, providers.ErrCapacity):
		return fail(crawlv1alpha1.ReasonNoCapacity, providers.TerminalMessage(err))
	case errors.Is(err, providers.ErrQuota):
		return fail(crawlv1alpha1.ReasonQuotaExceeded, providers.TerminalMessage(err))
	case errors.Is(err, providers.ErrTerminal):
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
