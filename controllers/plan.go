package controllers

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
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
	// Recheck, when set, is how soon to look again with no event: the moment
	// an Unhealthy proxy's replacement period runs out, say.
	Recheck time.Duration
	// Cause, on a Delete or Create that replaces an instance, is why it is
	// replaced (a Reason), counted in proxy_operator_replacements_total.
	Cause string
	// Budgeted replacements count against the provider instance's bound on
	// replacements in flight; the executor holds them when it is spent.
	Budgeted bool
	// Quiet: the pass writes no status. A new proxy's instance is created
	// and starts without a word; the write that records it running is its
	// first (see QuietStart).
	Quiet bool
}

// QuietStart is how long a new proxy's instance may take to start before
// its status records it starting. One that runs sooner goes from no status
// to Ready in one write, where recording its creation cost a write more
// (docs/architecture.md, decision 59); one that takes longer, a VM say, is
// shown Provisioning after it.
const QuietStart = 10 * time.Second

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
	ReasonCredentialsError  = "CredentialsError"
	ReasonFinalizerAdded    = "FinalizerAdded"
	ReasonInstanceDeleted   = "InstanceDeleted"
	ReasonProviderTransient = "ProviderUnavailable"
	// ReasonInstanceLost: a proxy that was Ready has no instance any more
	// (deleted behind the operator's back, a preempted Spot VM).
	ReasonInstanceLost = "InstanceLost"
	// ReasonUnhealthy: the proxy failed its probes for longer than its
	// replacement period.
	ReasonUnhealthy = crawlv1alpha1.ReasonUnhealthyTooLong
	// ReasonProbeTargetSuspect: the replacement is held because too many
	// proxies probed against the same URL fail at once.
	ReasonProbeTargetSuspect = "ProbeTargetSuspect"
	// ReasonReplacementsBusy: the replacement is held because the provider
	// instance already has its bound of replacements in flight.
	ReasonReplacementsBusy = "ReplacementsBusy"
	// ReasonBanned: sites blocked the instance on enough hosts (the
	// Banned condition, the ban judge's).
	ReasonBanned = crawlv1alpha1.ReasonBanned
	// ReasonBurnedIP: the new instance came up on an exit IP retired for
	// bans; it is replaced before it serves.
	ReasonBurnedIP = "BurnedIP"
	// ReasonBurnedIPAccepted: the instance came up on a burned IP after the
	// last reroll allowed; it serves, and the status says so.
	ReasonBurnedIPAccepted = "BurnedIPAccepted"
	// ReasonBurnedIPUnknown: the burned-IP memory did not answer; the new
	// instance waits for it rather than risk serving a burned IP.
	ReasonBurnedIPUnknown = "BurnedIPUnknown"
	// ReasonStartupTimeout: the instance has not been running for longer
	// than the startup timeout (a VM stuck booting, a crash-looping
	// container).
	ReasonStartupTimeout = "StartupTimeout"
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
	// credentials are what the instance must require of its clients.
	credentials credentials.Credentials
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
	// instanceProvider is the provider instance that holds instance.
	instanceProvider string
	// ownerCollected says that every provider the Proxy names (spec.provider,
	// and status.provider while an instance may be left there) deletes its
	// instances with their Proxy (providers.OwnerCollected): the Proxy needs
	// no finalizer.
	ownerCollected bool

	// now is the reconciler's clock, read once per pass.
	now time.Time
	// health is what the health engine knows of the proxy; nil when it
	// probes it not (or no engine runs).
	health *ProxyHealth
	// replacement are the rules for replacing an Unhealthy proxy.
	replacement ReplacementPolicy
	// pool is the ProxyPool the proxy belongs to ("" for none): a member
	// Unhealthy too long or banned is marked, and its pool replaces it.
	pool string
	// ban is the Banned condition about the current instance (nil: none).
	ban *metav1.Condition
	// burnedUntil is when the running instance's IP stops being burned
	// (zero: it is not, or it was checked when it began serving);
	// burnedErr says the memory could not tell.
	burnedUntil time.Time
	burnedErr   error
	// maxRerolls bounds the instances in a row replaced for a burned IP.
	maxRerolls int
}

// ProxyHealth is the health engine's in-memory view of one proxy, fresher
// than the status it writes.
type ProxyHealth struct {
	// UnhealthySince is when the current, unbroken Unhealthy verdict began;
	// zero when the proxy is not Unhealthy.
	UnhealthySince time.Time
	// URL is what the proxy is probed against; Probed and Unhealthy count
	// the Managed proxies probed against that URL, and those Unhealthy now.
	URL               string
	Probed, Unhealthy int
	// LastSuspect is when the URL last met ReplacementPolicy.TargetSuspect,
	// as the engine saw its counts change (zero: not since it started).
	// Time Unhealthy during a suspected outage does not count toward
	// replacement. It is lost on a restart, which errs toward replacing
	// (after a full period) over keeping.
	LastSuspect time.Time
}

// ReplacementPolicy says when an Unhealthy Managed proxy is replaced.
type ReplacementPolicy struct {
	// After is how long it may stay Unhealthy; 0 turns replacement off.
	After time.Duration
	// MaxUnhealthyShare: when more than this share of the Managed proxies
	// probed against one URL are Unhealthy at once (and at least
	// minSuspectUnhealthy of them), the target is suspected, not the
	// proxies, and none is replaced.
	MaxUnhealthyShare float64
	// StartupTimeout is how long an instance may go without running (from
	// its creation, or from when it stopped running) before it is
	// replaced; 0 turns that off.
	StartupTimeout time.Duration
	// HeldRecheck is how soon a held replacement is looked at again; zero
	// means DefaultHeldRecheck.
	HeldRecheck time.Duration
}

// DefaultHeldRecheck is how soon a held replacement is looked at again.
const DefaultHeldRecheck = 30 * time.Second

func (r ReplacementPolicy) heldRecheck() time.Duration {
	if r.HeldRecheck > 0 {
		return r.HeldRecheck
	}
	return DefaultHeldRecheck
}

// minSuspectUnhealthy is the fewest Unhealthy proxies that can make a probe
// target suspect: one or two failing proxies of a small fleet say nothing
// about the target, and are replaced.
const minSuspectUnhealthy = 3

// targetSuspect says whether unhealthy of probed proxies sharing a probe URL
// point at the URL rather than at the proxies.
func targetSuspect(unhealthy, probed int, maxShare float64) bool {
	return unhealthy >= minSuspectUnhealthy && float64(unhealthy) > maxShare*float64(probed)
}

// TargetSuspect is targetSuspect under r's share: the rule the health
// engine stamps each URL's last suspicion by (health.Options.TargetSuspect).
func (r ReplacementPolicy) TargetSuspect(unhealthy, probed int) bool {
	return targetSuspect(unhealthy, probed, r.MaxUnhealthyShare)
}

// finalizerFirst says whether a Managed Proxy's next action is to add the
// finalizer, before anything else is looked at: it is not being deleted,
// has none, and its provider does not delete instances with their Proxy.
func finalizerFirst(p *crawlv1alpha1.Proxy, ownerCollected bool) bool {
	return p.Spec.Mode != crawlv1alpha1.ModeExternal && p.DeletionTimestamp.IsZero() &&
		!controllerutil.ContainsFinalizer(p, crawlv1alpha1.Finalizer) && !ownerCollected
}

// plan maps an observation to exactly one action. It is pure: no I/O, no
// clock, so every case is a table row in plan_test.go.
func plan(o observation) Action {
	p := o.proxy
	deleting := !p.DeletionTimestamp.IsZero()
	hasFinalizer := controllerutil.ContainsFinalizer(p, crawlv1alpha1.Finalizer)

	if p.Spec.Mode == crawlv1alpha1.ModeExternal {
		// Nothing to provision: an External proxy's record is what its
		// spec says, and the health engine writes it with its first
		// verdict (Proxy.AsRecorded), so it comes up with one write.
		if deleting && hasFinalizer {
			return Action{Type: ActionRemoveFinalizer, Reason: ReasonDeleting, Message: "External proxy has no instance to delete"}
		}
		return Action{Type: ActionNothing}
	}

	switch {
	case deleting && !hasFinalizer:
		return Action{Type: ActionNothing}
	case deleting:
		return planDeletion(o)
	case finalizerFirst(p, o.ownerCollected):
		return Action{Type: ActionAddFinalizer, Phase: phaseOr(p.Status.Phase, crawlv1alpha1.PhasePending),
			Reason: ReasonFinalizerAdded, Message: "waiting to provision"}
	case o.specErr != nil:
		return fail(o.specErr.reason, o.specErr.message)
	case o.getErr != nil:
		return providerFailure(o.getErr, crawlv1alpha1.PhaseProvisioning)
	case o.instance == nil && p.Status.Phase == crawlv1alpha1.PhaseReady:
		return Action{Type: ActionCreate, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceLost, Cause: ReasonInstanceLost,
			Message: fmt.Sprintf("instance %s is gone (deleted outside the operator, or preempted): creating a replacement with provider %s; it will come back with a new IP",
				o.instanceName, p.Spec.Provider)}
	case o.instance == nil && p.Status.Phase == crawlv1alpha1.PhaseReplacing:
		return Action{Type: ActionCreate, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonCreating,
			Message: fmt.Sprintf("creating the replacement instance %s with provider %s", o.instanceName, p.Spec.Provider)}
	case o.instance == nil:
		return Action{Type: ActionCreate, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonCreating, Quiet: unrecorded(p),
			Message: fmt.Sprintf("creating instance %s with provider %s", o.instanceName, p.Spec.Provider)}
	}

	inst := o.instance
	switch {
	case inst.State == providers.StateStopping && p.Status.Phase == crawlv1alpha1.PhaseReady:
		// Not the operator's deletion: it would have set Replacing first.
		return Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceLost, Cause: ReasonInstanceLost,
			Message: fmt.Sprintf("instance %s is being deleted outside the operator: waiting for it to go, then creating a replacement; it will come back with a new IP", inst.Name)}
	case inst.State == providers.StateStopping:
		return Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceStopping,
			Message: fmt.Sprintf("waiting for instance %s to be deleted before creating its replacement", inst.Name)}
	case inst.OwnerUID() != string(p.UID):
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonStaleInstance, Cause: ReasonStaleInstance,
			Message: fmt.Sprintf("instance %s belongs to an earlier Proxy of the same name (uid %q); deleting it", inst.Name, inst.OwnerUID())}
	case inst.SpecHash() != o.desiredHash:
		// A serving instance is replaced within the provider instance's
		// budget, so a rotation (a new password, a new cloud-init, a
		// template change) never takes the whole fleet down at once.
		serving := inst.State == providers.StateRunning && p.Status.Phase == crawlv1alpha1.PhaseReady
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonSpecChanged, Cause: ReasonSpecChanged, Budgeted: serving,
			Message: fmt.Sprintf("spec changed (hash %s, instance has %s): replacing instance %s; it will come back with a new IP", o.desiredHash, inst.SpecHash(), inst.Name)}
	case inst.State == providers.StateFailed:
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonInstanceFailed, Cause: ReasonInstanceFailed,
			Message: fmt.Sprintf("instance %s stopped (%s): replacing it; it will come back with a new IP", inst.Name, orUnknown(inst.Message))}
	case inst.State == providers.StatePending && o.replacement.StartupTimeout > 0 && o.now.Sub(notRunningSince(p, inst)) >= o.replacement.StartupTimeout:
		// Not budgeted: an instance that does not run serves nobody, so
		// replacing it takes nothing out of service.
		return Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonStartupTimeout, Cause: ReasonStartupTimeout,
			Message: fmt.Sprintf("instance %s has not been running for longer than the startup timeout %s (%s): replacing it; it will come back with a new IP",
				inst.Name, o.replacement.StartupTimeout, orUnknown(inst.Message))}
	case inst.State == providers.StatePending && inst.Message == "" && unrecorded(p) && o.now.Sub(inst.CreatedAt) < QuietStart:
		// A new proxy starting as expected: nothing to record until it
		// runs, unless it takes longer than QuietStart.
		return Action{Type: ActionWait, Quiet: true, Recheck: QuietStart - o.now.Sub(inst.CreatedAt)}
	case inst.State == providers.StatePending && inst.Message == "" && creating(p, inst.Name):
		// Starting as expected: the status that recorded its creation says
		// all there is, and restating it would be a write for nothing.
		provisioned := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
		return Action{Type: ActionWait, Phase: p.Status.Phase, Reason: provisioned.Reason, Message: p.Status.Message}
	case inst.State == providers.StatePending:
		return Action{Type: ActionWait, Phase: phaseWhileStarting(p), Reason: ReasonProvisioning,
			Message: fmt.Sprintf("instance %s is starting: %s", inst.Name, orUnknown(inst.Message))}
	}
	return planRunning(o)
}

// notRunningSince is when inst last began not running: its creation, or,
// for an instance that ran (the health engine judged it), the moment the
// status recorded it stop running (the Provisioned condition turning
// False), whichever is later. A new instance's own Provisioning record
// comes after its creation and never moves the deadline.
func notRunningSince(p *crawlv1alpha1.Proxy, inst *providers.Instance) time.Time {
	since := inst.CreatedAt
	ran := strings.HasPrefix(p.Status.HealthCheckedInstance, inst.Name+"/")
	if c := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned); c != nil && ran &&
		c.Status != metav1.ConditionTrue && p.Status.InstanceName == inst.Name && c.LastTransitionTime.After(since) {
		since = c.LastTransitionTime.Time
	}
	return since
}

// unrecorded says whether p's status has recorded nothing of an instance:
// a new proxy, whose instance is created and started quietly. A status that
// says something else (Failed, say) is brought up to date by the first
// action instead.
func unrecorded(p *crawlv1alpha1.Proxy) bool {
	return p.Status.InstanceName == "" && (p.Status.Phase == "" || p.Status.Phase == crawlv1alpha1.PhasePending)
}

// creating says whether p's status records the creation of instance name,
// and nothing since.
func creating(p *crawlv1alpha1.Proxy, name string) bool {
	provisioned := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
	return p.Status.InstanceName == name && provisioned != nil && provisioned.Reason == ReasonCreating &&
		(p.Status.Phase == crawlv1alpha1.PhaseProvisioning || p.Status.Phase == crawlv1alpha1.PhaseReplacing)
}
