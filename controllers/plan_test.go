package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

const (
	testUID  = "uid-1"
	testHash = "hash-now"
)

// proxyFixture is a Managed Proxy; options adjust it per row.
func proxyFixture(opts ...func(*crawlv1alpha1.Proxy)) *crawlv1alpha1.Proxy {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1", UID: testUID, Generation: 1,
			Finalizers: []string{crawlv1alpha1.Finalizer}},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func withoutFinalizer(p *crawlv1alpha1.Proxy) { p.Finalizers = nil }
func deleting(p *crawlv1alpha1.Proxy) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
}
func recorded(name string) func(*crawlv1alpha1.Proxy) {
	return func(p *crawlv1alpha1.Proxy) { p.Status.InstanceName = name }
}
func external(p *crawlv1alpha1.Proxy) {
	p.Spec.Mode, p.Spec.Provider, p.Finalizers = crawlv1alpha1.ModeExternal, "", nil
	p.Spec.External = &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.1"}
}

func instance(state providers.State, hash, uid string) *providers.Instance {
	return &providers.Instance{
		Name: "px-crawl-eu-1-0123456789", State: state, IP: "127.0.0.10", Port: 3128,
		Labels: map[string]string{crawlv1alpha1.LabelSpecHash: hash, crawlv1alpha1.LabelOwnerUID: uid},
	}
}

// creatingRecorded is the status ActionCreate leaves.
func creatingRecorded(p *crawlv1alpha1.Proxy) {
	p.Status.Phase, p.Status.InstanceName, p.Status.Message = crawlv1alpha1.PhaseProvisioning, "px-crawl-eu-1-0123456789", "creating instance px-crawl-eu-1-0123456789"
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionFalse,
		ObservedGeneration: p.Generation, Reason: ReasonCreating, Message: p.Status.Message})
}

// planNow is TestPlan's clock.
var planNow = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// createdAgo sets when the provider made inst, by planNow.
func createdAgo(d time.Duration, inst *providers.Instance) *providers.Instance {
	inst.CreatedAt = planNow.Add(-d)
	return inst
}

func heldUp(inst *providers.Instance) *providers.Instance {
	inst.Message = "container squid: ErrImagePull pull access denied"
	return inst
}

// TestStartingAsExpectedWritesNothing: while an instance starts as
// expected, the status its creation left is the next status too.
func TestStartingAsExpectedWritesNothing(t *testing.T) {
	p := proxyFixture(creatingRecorded)
	o := observation{proxy: p, instance: instance(providers.StatePending, testHash, testUID), desiredHash: testHash, instanceProvider: "kind-local",
		instanceName: "px-crawl-eu-1-0123456789"}
	p.Status.Provider, p.Status.SpecHash, p.Status.ObservedGeneration = "kind-local", testHash, p.Generation
	a := plan(o)
	assert.Equal(t, p.Status, nextStatus(p, o, a), "no write while it starts as expected")
	held := o
	held.instance = heldUp(instance(providers.StatePending, testHash, testUID))
	assert.NotEqual(t, p.Status, nextStatus(p, held, plan(held)), "what holds it up is written")
}

func TestPlan(t *testing.T) {
	transient := providers.Transient(errors.New("503 backend unavailable"))
	terminal := providers.Terminal("quota CPUS exceeded in europe-west1")
	cases := []struct {
		name       string
		proxy      *crawlv1alpha1.Proxy
		instance   *providers.Instance
		getErr     error
		specErr    *specError
		wantType   ActionType
		wantPhase  crawlv1alpha1.ProxyPhase
		wantReason string
		wantErr    bool
		wantQuiet  bool
		// ownerCollected: every provider the Proxy names deletes its
		// instances with it (the kubernetes provider).
		ownerCollected bool
	}{
		// Life of a Managed proxy.
		{name: "finalizer absent: add it first", proxy: proxyFixture(withoutFinalizer),
			wantType: ActionAddFinalizer, wantPhase: crawlv1alpha1.PhasePending},
		{name: "finalizer absent even with a bad spec: finalizer first", proxy: proxyFixture(withoutFinalizer),
			specErr: &specError{ReasonCloudInitError, "x"}, wantType: ActionAddFinalizer},
		{name: "finalizer absent, provider deletes instances with their Proxy: create, no finalizer", proxy: proxyFixture(withoutFinalizer), ownerCollected: true,
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonCreating, wantQuiet: true},
		{name: "finalizer absent, provider deletes instances with their Proxy, bad spec: fail at once", proxy: proxyFixture(withoutFinalizer), ownerCollected: true,
			specErr: &specError{ReasonCloudInitError, "x"}, wantType: ActionFail, wantReason: ReasonCloudInitError},
		{name: "no instance, nothing recorded: create quietly", proxy: proxyFixture(),
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonCreating, wantQuiet: true},
		{name: "no instance after a recorded failure: create, and say so", proxy: proxyFixture(func(p *crawlv1alpha1.Proxy) { p.Status.Phase = crawlv1alpha1.PhaseFailed }),
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonCreating},
		{name: "new proxy's instance starting as expected: wait quietly", proxy: proxyFixture(), instance: createdAgo(QuietStart-time.Second, instance(providers.StatePending, testHash, testUID)),
			wantType: ActionWait, wantQuiet: true},
		{name: "new proxy's instance slower than QuietStart: say it is starting", proxy: proxyFixture(), instance: createdAgo(QuietStart, instance(providers.StatePending, testHash, testUID)),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonProvisioning},
		{name: "new proxy's instance held up: say why at once", proxy: proxyFixture(), instance: heldUp(createdAgo(0, instance(providers.StatePending, testHash, testUID))),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonProvisioning},
		{name: "instance starting as recorded at its creation: wait, saying nothing new", proxy: proxyFixture(creatingRecorded), instance: instance(providers.StatePending, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonCreating},
		{name: "instance held up while starting: say why", proxy: proxyFixture(creatingRecorded), instance: heldUp(instance(providers.StatePending, testHash, testUID)),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonProvisioning},
		{name: "instance running with current hash: mark ready", proxy: proxyFixture(), instance: instance(providers.StateRunning, testHash, testUID),
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning},
		{name: "instance with a stale hash: delete to replace", proxy: proxyFixture(), instance: instance(providers.StateRunning, "hash-old", testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonSpecChanged},
		{name: "pending instance with a stale hash: delete to replace", proxy: proxyFixture(), instance: instance(providers.StatePending, "hash-old", testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonSpecChanged},
		{name: "old instance stopping: wait before creating the replacement", proxy: proxyFixture(), instance: instance(providers.StateStopping, "hash-old", testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceStopping},
		{name: "instance failed (terminated VM): replace", proxy: proxyFixture(), instance: instance(providers.StateFailed, testHash, testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceFailed},
		{name: "instance of an earlier Proxy with the same name: delete it", proxy: proxyFixture(), instance: instance(providers.StateRunning, testHash, "uid-0"),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonStaleInstance},
		{name: "instance missing while status says Ready: recreate", proxy: proxyFixture(recorded("px-crawl-eu-1-0123456789"), func(p *crawlv1alpha1.Proxy) {
			p.Status.Phase, p.Status.IP = crawlv1alpha1.PhaseReady, "127.0.0.10"
		}), wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceLost},

		// The spec cannot be realised.
		{name: "unknown provider: fail", proxy: proxyFixture(), specErr: &specError{ReasonProviderNotFound, "provider \"x\" is not configured"},
			wantType: ActionFail, wantPhase: crawlv1alpha1.PhaseFailed, wantReason: ReasonProviderNotFound},
		{name: "cloud-init Secret missing: fail, leave the running instance alone", proxy: proxyFixture(), instance: instance(providers.StateRunning, "hash-old", testUID),
			specErr: &specError{ReasonCloudInitError, "Secret not found"}, wantType: ActionFail, wantReason: ReasonCloudInitError},
		{name: "invalid placement: fail before any create", proxy: proxyFixture(),
			specErr: &specError{ReasonInvalidPlacement, "placement.machineType is required"}, wantType: ActionFail, wantReason: ReasonInvalidPlacement},

		// Provider errors.
		{name: "transient Get error: wait and back off", proxy: proxyFixture(), getErr: transient,
			wantType: ActionWait, wantReason: ReasonProviderTransient, wantErr: true},
		{name: "terminal Get error: fail", proxy: proxyFixture(), getErr: terminal,
			wantType: ActionFail, wantPhase: crawlv1alpha1.PhaseFailed, wantReason: ReasonProviderError},
		{name: "no capacity: fail, saying so (a pool places the member elsewhere)", proxy: proxyFixture(), getErr: providers.Capacity("ZONE_RESOURCE_POOL_EXHAUSTED"),
			wantType: ActionFail, wantPhase: crawlv1alpha1.PhaseFailed, wantReason: crawlv1alpha1.ReasonNoCapacity},
		{name: "quota: fail, saying so", proxy: proxyFixture(), getErr: providers.Quota("quota exceeded: InstanceLimitExceeded"),
			wantType: ActionFail, wantPhase: crawlv1alpha1.PhaseFailed, wantReason: crawlv1alpha1.ReasonQuotaExceeded},
		{name: "unclassified Get error: retried, not failed", proxy: proxyFixture(), getErr: errors.New("connection reset"),
			wantType: ActionWait, wantReason: ReasonProviderError, wantErr: true},

		// Deletion.
		{name: "deleting while the instance is creating: delete it", proxy: proxyFixture(deleting), instance: instance(providers.StatePending, testHash, testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseDeleting, wantReason: ReasonDeleting},
		{name: "deleting with the instance running: delete it", proxy: proxyFixture(deleting), instance: instance(providers.StateRunning, testHash, testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseDeleting},
		{name: "deleting, instance stopping: keep the finalizer and wait", proxy: proxyFixture(deleting), instance: instance(providers.StateStopping, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseDeleting},
		{name: "deleting, instance gone: remove the finalizer", proxy: proxyFixture(deleting, recorded("px-crawl-eu-1-0123456789")),
			wantType: ActionRemoveFinalizer},
		{name: "deleting, transient Get error: keep the finalizer and retry", proxy: proxyFixture(deleting), getErr: transient,
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseDeleting, wantErr: true},
		{name: "deleting, terminal Get error: fail, keep the finalizer", proxy: proxyFixture(deleting), getErr: terminal,
			wantType: ActionFail},
		{name: "deleting, provider gone, an instance was recorded: fail, keep the finalizer", proxy: proxyFixture(deleting, recorded("px-1")),
			specErr: &specError{ReasonProviderNotFound, "provider gone"}, wantType: ActionFail, wantReason: ReasonProviderNotFound},
		{name: "deleting, provider gone, nothing ever recorded: remove the finalizer", proxy: proxyFixture(deleting),
			specErr: &specError{ReasonProviderNotFound, "provider gone"}, wantType: ActionRemoveFinalizer},
		{name: "deleting without our finalizer: nothing", proxy: proxyFixture(deleting, withoutFinalizer),
			wantType: ActionNothing},
		{name: "deleting without a finalizer, provider deletes instances with their Proxy: nothing until it is gone", proxy: proxyFixture(deleting, withoutFinalizer),
			ownerCollected: true, instance: instance(providers.StateRunning, testHash, testUID), wantType: ActionNothing},
		{name: "deleting with the finalizer, provider deletes instances with their Proxy: delete it as before", proxy: proxyFixture(deleting),
			ownerCollected: true, instance: instance(providers.StateRunning, testHash, testUID), wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseDeleting},

		// External proxies never touch a provider, and their record is the
		// health engine's (Proxy.AsRecorded).
		{name: "External: nothing to provision", proxy: proxyFixture(external), wantType: ActionNothing},
		{name: "External deleting: nothing", proxy: proxyFixture(external, deleting), wantType: ActionNothing},
		{name: "External deleting with a finalizer: remove it", proxy: proxyFixture(external, deleting, func(p *crawlv1alpha1.Proxy) {
			p.Finalizers = []string{crawlv1alpha1.Finalizer}
		}), wantType: ActionRemoveFinalizer},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := plan(observation{
				proxy: tc.proxy, instanceName: "px-crawl-eu-1-0123456789", desiredHash: testHash,
				instance: tc.instance, getErr: tc.getErr, specErr: tc.specErr, now: planNow, ownerCollected: tc.ownerCollected,
			})
			assert.Equal(t, tc.wantType, got.Type, "message: %s", got.Message)
			if tc.wantPhase != "" {
				assert.Equal(t, tc.wantPhase, got.Phase)
			}
			if tc.wantReason != "" {
				assert.Equal(t, tc.wantReason, got.Reason)
			}
			assert.Equal(t, tc.wantErr, got.Err != nil, "a retried wait carries its error, nothing else does")
			assert.Equal(t, tc.wantQuiet, got.Quiet, "only a new proxy's instance is created and started without a status write")
			if tc.wantQuiet && got.Type == ActionWait {
				assert.Positive(t, got.Recheck, "a quiet start is looked at again when QuietStart runs out")
			}
			if got.Type != ActionNothing && (!got.Quiet || got.Type != ActionWait) {
				assert.NotEmpty(t, got.Message, "every action explains itself")
			}
		})
	}
}

func TestNextStatus(t *testing.T) {
	t.Run("mark ready records the instance; the verdict is the engine's", func(t *testing.T) {
		p := proxyFixture()
		inst := instance(providers.StateRunning, testHash, testUID)
		o := observation{proxy: p, instance: inst, instanceProvider: "kind-local", desiredHash: testHash}
		s := nextStatus(p, o, plan(o))
		assert.Equal(t, crawlv1alpha1.PhaseReady, s.Phase)
		assert.Equal(t, "127.0.0.10", s.IP)
		assert.Equal(t, int32(3128), s.Port)
		assert.Equal(t, inst.Name, s.InstanceName)
		assert.Equal(t, "kind-local", s.Provider)
		assert.Equal(t, testHash, s.SpecHash)
		assert.Equal(t, int64(1), s.ObservedGeneration)
		assertCondition(t, s, crawlv1alpha1.ConditionProvisioned, metav1.ConditionTrue, ReasonInstanceRunning)
		p.Status = s
		assert.Equal(t, crawlv1alpha1.ReasonAwaitingProbe, p.ReadyCondition(p.RecordedHealth()).Reason, "Ready waits for the engine's verdict")

		// Applying the same observation again changes nothing: no write.
		p.Status = s
		assert.Equal(t, s, nextStatus(p, o, plan(o)))
	})

	t.Run("a verdict about the recorded instance makes it Ready, by the rule", func(t *testing.T) {
		p := proxyFixture()
		o := observation{proxy: p, instance: instance(providers.StateRunning, testHash, testUID), instanceProvider: "kind-local", desiredHash: testHash}
		p.Status = nextStatus(p, o, plan(o))
		p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded"})
		p.Status.HealthCheckedInstance = "px-old/hash-old@127.0.0.9:3128"
		assert.False(t, p.IsReady(), "a verdict about another instance is none")
		p.Status.HealthCheckedInstance = p.Status.Instance()
		assert.True(t, p.IsReady())
	})

	t.Run("replacement clears the address and the health verdict", func(t *testing.T) {
		p := proxyFixture(func(p *crawlv1alpha1.Proxy) {
			p.Status.IP, p.Status.Port, p.Status.Phase = "127.0.0.10", 3128, crawlv1alpha1.PhaseReady
			p.Status.Conditions = []metav1.Condition{{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded"}}
		})
		o := observation{proxy: p, instance: instance(providers.StateRunning, "hash-old", testUID), desiredHash: testHash}
		s := nextStatus(p, o, plan(o))
		assert.Equal(t, crawlv1alpha1.PhaseReplacing, s.Phase)
		assert.Empty(t, s.IP, "the old address must not be handed out")
		p.Status = s
		assert.Equal(t, crawlv1alpha1.ReasonNotProvisioned, p.ReadyCondition(p.RecordedHealth()).Reason, "not Ready, whatever the verdict said")
	})

	t.Run("a dual-stack instance's IPv6 range and session addresses are recorded, and cleared with its address", func(t *testing.T) {
		p := proxyFixture()
		inst := instance(providers.StateRunning, testHash, testUID)
		inst.IPv6Prefix, inst.SessionAddresses = "2001:db8:6:1:0:5::/96", 16
		o := observation{proxy: p, instance: inst, instanceProvider: "kind-local", desiredHash: testHash}
		s := nextStatus(p, o, plan(o))
		assert.Equal(t, "2001:db8:6:1:0:5::/96", s.IPv6Prefix)
		assert.Equal(t, int32(16), s.SessionAddresses)
		assert.Equal(t, "2001:db8:6:1:0:5::/96", *statusApply(p, s).Status.IPv6Prefix, "applied by the reconciler")

		p.Status = s
		replaced := observation{proxy: p, instance: instance(providers.StateRunning, "hash-old", testUID), desiredHash: testHash}
		s = nextStatus(p, replaced, plan(replaced))
		assert.Empty(t, s.IPv6Prefix, "the old range must not be handed out")
		assert.Zero(t, s.SessionAddresses)
	})
}

// TestNextStatusLeavesHealthToTheEngine: whatever the reconciler does,
// the fields the health engine owns are not in what it applies, and a pass
// that only differs in them writes nothing.
func TestNextStatusLeavesHealthToTheEngine(t *testing.T) {
	running := instance(providers.StateRunning, testHash, testUID)
	p := proxyFixture(creatingRecorded)
	o := observation{proxy: p, instance: running, instanceProvider: "kind-local", desiredHash: testHash}
	next := nextStatus(p, o, plan(o))
	assertCondition(t, next, crawlv1alpha1.ConditionProvisioned, metav1.ConditionTrue, ReasonInstanceRunning)
	assert.Nil(t, meta.FindStatusCondition(next.Conditions, crawlv1alpha1.ConditionHealthy), "a new address carries no verdict of the reconciler's")

	judged := p.DeepCopy()
	judged.Status = next
	judged.Status.HealthCheckedInstance = next.Instance()
	at := metav1.Now()
	judged.Status.LastHealthCheckTime = &at
	meta.SetStatusCondition(&judged.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded"})
	meta.SetStatusCondition(&judged.Status.Conditions, judged.ReadyCondition(judged.RecordedHealth()))
	assert.Equal(t, reconcilerPart(next), reconcilerPart(judged.Status), "the engine's verdict is no change of the reconciler's")
	again := nextStatus(judged, o, plan(observation{proxy: judged, instance: running, instanceProvider: "kind-local", desiredHash: testHash}))
	assert.Equal(t, reconcilerPart(judged.Status), reconcilerPart(again), "a serving proxy's next pass writes nothing")

	apply := statusApply(judged, again)
	require.NotNil(t, apply.Status)
	assert.Nil(t, apply.Status.LastHealthCheckTime)
	assert.Nil(t, apply.Status.HealthCheckedInstance)
	require.Len(t, apply.Status.Conditions, 1)
	assert.Equal(t, crawlv1alpha1.ConditionProvisioned, *apply.Status.Conditions[0].Type)
	assert.Equal(t, "127.0.0.10", *apply.Status.IP)

	deleted := nextStatus(judged, o, Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonUnhealthy})
	cleared := statusApply(judged, deleted)
	require.NotNil(t, cleared.Status.IP, "an address going away is applied as empty, not left out")
	assert.Empty(t, *cleared.Status.IP)
	assert.Zero(t, *cleared.Status.Port)
}

func assertCondition(t *testing.T, s crawlv1alpha1.ProxyStatus, condType string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	for _, c := range s.Conditions {
		if c.Type == condType {
			assert.Equal(t, status, c.Status, "%s status", condType)
			assert.Equal(t, reason, c.Reason, "%s reason", condType)
			return
		}
	}
	t.Errorf("no %s condition in %+v", condType, s.Conditions)
}

// TestWorthAnEvent: Events for what a person wants to know of, never for a
// routine bring-up.
func TestWorthAnEvent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		previous crawlv1alpha1.ProxyPhase
		a        Action
		want     bool
	}{
		{"creating", "", Action{Type: ActionCreate, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonCreating}, false},
		{"still provisioning", crawlv1alpha1.PhaseProvisioning, Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonProvisioning}, false},
		{"first Ready", crawlv1alpha1.PhaseProvisioning, Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonInstanceRunning}, false},
		{"Ready again after a replacement", crawlv1alpha1.PhaseReplacing, Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonInstanceRunning}, true},
		{"a replacement starts", crawlv1alpha1.PhaseReady, Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseReplacing, Reason: ReasonSpecChanged, Cause: ReasonSpecChanged}, true},
		{"deleting", crawlv1alpha1.PhaseReady, Action{Type: ActionDelete, Phase: crawlv1alpha1.PhaseDeleting, Reason: ReasonDeleting}, true},
		{"a provider error", crawlv1alpha1.PhaseProvisioning, Action{Type: ActionWait, Phase: crawlv1alpha1.PhaseProvisioning, Reason: ReasonProviderError, Err: errors.New("boom")}, true},
		{"a spec error", "", Action{Type: ActionFail, Phase: crawlv1alpha1.PhaseFailed, Reason: ReasonInvalidPlacement}, true},
		{"a held replacement", crawlv1alpha1.PhaseReady, Action{Type: ActionMarkReady, Phase: crawlv1alpha1.PhaseReady, Reason: ReasonReplacementsBusy}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, worthAnEvent(tc.previous, tc.a))
		})
	}
}

// TestStartupTimeout: an instance that does not run (a VM stuck booting, a
// crash-looping Squid) is replaced once it has not run for the startup
// timeout, counted from its creation or from when the status recorded it
// stop running, never from an earlier instance's record.
func TestStartupTimeout(t *testing.T) {
	const timeout = 10 * time.Minute
	crashed := func(ago time.Duration) func(*crawlv1alpha1.Proxy) {
		return func(p *crawlv1alpha1.Proxy) {
			p.Status.Phase, p.Status.InstanceName = crawlv1alpha1.PhaseProvisioning, "px-crawl-eu-1-0123456789"
			p.Status.HealthCheckedInstance = "px-crawl-eu-1-0123456789/" + testHash + "@10.0.0.5:3128" // it ran
			p.Status.Conditions = []metav1.Condition{{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionFalse,
				Reason: ReasonProvisioning, LastTransitionTime: metav1.NewTime(planNow.Add(-ago))}}
		}
	}
	crashLooping := func(created time.Duration) *providers.Instance {
		inst := createdAgo(created, instance(providers.StatePending, testHash, testUID))
		inst.Message = "container squid: CrashLoopBackOff back-off 5m0s restarting failed container"
		return inst
	}
	// creatingAt is the status an ActionCreate left at planNow-ago.
	creatingAt := func(ago time.Duration) func(*crawlv1alpha1.Proxy) {
		return func(p *crawlv1alpha1.Proxy) {
			creatingRecorded(p)
			p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(planNow.Add(-ago))
		}
	}
	cases := []struct {
		name     string
		proxy    *crawlv1alpha1.Proxy
		instance *providers.Instance
		timeout  time.Duration
		replace  bool
	}{
		{name: "new instance never ran for the timeout", proxy: proxyFixture(creatingAt(timeout)), instance: createdAgo(timeout, instance(providers.StatePending, testHash, testUID)), timeout: timeout, replace: true},
		{name: "new instance still within it", proxy: proxyFixture(creatingAt(timeout)), instance: createdAgo(timeout-time.Second, instance(providers.StatePending, testHash, testUID)), timeout: timeout},
		{name: "new instance: counted from its creation, not from its status's Provisioning record 10s later", proxy: proxyFixture(creatingAt(timeout - 10*time.Second)),
			instance: createdAgo(timeout, instance(providers.StatePending, testHash, testUID)), timeout: timeout, replace: true},
		{name: "quiet new proxy past the timeout", proxy: proxyFixture(), instance: createdAgo(timeout+time.Minute, instance(providers.StatePending, testHash, testUID)), timeout: timeout, replace: true},
		{name: "old pod crash-looping since the timeout", proxy: proxyFixture(crashed(timeout)), instance: crashLooping(24 * time.Hour), timeout: timeout, replace: true},
		{name: "old pod crash-looping for a minute: its age does not count", proxy: proxyFixture(crashed(time.Minute)), instance: crashLooping(24 * time.Hour), timeout: timeout},
		{name: "an earlier instance's record does not count", proxy: proxyFixture(crashed(time.Hour)), instance: func() *providers.Instance {
			inst := crashLooping(time.Minute)
			inst.Name = "px-crawl-eu-1-other"
			return inst
		}(), timeout: timeout},
		{name: "timeout 0: never", proxy: proxyFixture(crashed(24 * time.Hour)), instance: crashLooping(48 * time.Hour)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := plan(observation{proxy: c.proxy, instance: c.instance, desiredHash: testHash, instanceProvider: "kind-local",
				instanceName: c.instance.Name, now: planNow, replacement: ReplacementPolicy{StartupTimeout: c.timeout}})
			if !c.replace {
				assert.Equal(t, ActionWait, a.Type, "%+v", a)
				return
			}
			assert.Equal(t, ActionDelete, a.Type, "%+v", a)
			assert.Equal(t, crawlv1alpha1.PhaseReplacing, a.Phase)
			assert.Equal(t, ReasonStartupTimeout, a.Cause)
			assert.False(t, a.Budgeted, "an instance that does not run serves nobody: no budget")
			assert.Contains(t, a.Message, "startup timeout")
		})
	}
}

// TestBansAndBurnedIPs: a banned instance is replaced (a pool member is
// marked for its pool); a new instance on a burned IP is replaced before it
// serves, at most maxRerolls times in a row, and the count goes back to 0
// once one serves; a memory that cannot tell holds the instance back.
func TestBansAndBurnedIPs(t *testing.T) {
	ban := &metav1.Condition{Type: crawlv1alpha1.ConditionBanned, Status: metav1.ConditionTrue, Reason: crawlv1alpha1.ReasonBlockedOnHosts,
		Message: "blocked by 3 hosts within 10m0s: a.example, b.example, c.example"}
	running := func() *providers.Instance { return instance(providers.StateRunning, testHash, testUID) }
	base := func(p *crawlv1alpha1.Proxy) observation {
		return observation{proxy: p, instance: running(), desiredHash: testHash, instanceProvider: "kind-local",
			instanceName: "px-crawl-eu-1-0123456789", now: planNow, maxRerolls: 2}
	}
	isController := true
	pooled := func(p *crawlv1alpha1.Proxy) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "eu", UID: "pool", Controller: &isController}}
	}

	o := base(proxyFixture())
	o.ban = ban
	a := plan(o)
	assert.Equal(t, ActionDelete, a.Type)
	assert.Equal(t, ReasonBanned, a.Cause)
	assert.True(t, a.Budgeted, "a banned proxy still serves: its replacement is budgeted")
	assert.Contains(t, a.Message, "a.example")

	o = base(proxyFixture(pooled))
	o.ban, o.pool = ban, "eu"
	a = plan(o)
	assert.Equal(t, ActionMarkReady, a.Type, "a member is replaced by its pool")
	assert.Equal(t, ReasonBanned, a.Reason)

	p := proxyFixture(creatingRecorded)
	o = base(p)
	o.burnedUntil = planNow.Add(time.Hour)
	a = plan(o)
	assert.Equal(t, ActionDelete, a.Type)
	assert.Equal(t, ReasonBurnedIP, a.Cause)
	assert.False(t, a.Budgeted, "it serves nobody yet")
	assert.EqualValues(t, 1, nextStatus(p, o, a).BurnedIPRerolls)

	p.Status.BurnedIPRerolls = 2
	a = plan(o)
	assert.Equal(t, ActionMarkReady, a.Type, "after maxRerolls it serves")
	assert.Equal(t, ReasonBurnedIPAccepted, a.Reason)
	o.burnedUntil = time.Time{}
	a = plan(o)
	assert.Equal(t, ReasonInstanceRunning, a.Reason)
	assert.EqualValues(t, 0, nextStatus(p, o, a).BurnedIPRerolls, "back to 0 once one serves")

	o.burnedErr = errors.New("redis: connection refused")
	a = plan(o)
	assert.Equal(t, ActionWait, a.Type)
	assert.Equal(t, ReasonBurnedIPUnknown, a.Reason)
	assert.NoError(t, a.Err, "polled again, not backed off")
	assert.Contains(t, a.Message, "connection refused")
}

// burnedAt is a burned-IP memory that knows one burned address.
type burnedAt struct {
	ip    string
	until time.Time
	asked []string
}

func (b *burnedAt) BurnedUntil(_ context.Context, _, ip string) (time.Time, error) {
	b.asked = append(b.asked, ip)
	if ip == b.ip {
		return b.until, nil
	}
	return time.Time{}, nil
}

// TestANewInstanceInABurnedIPv6RangeIsBurned: before a new instance
// serves, its IPv6 range is asked about as well as its IP (the memory
// keys both by sender: the range's /64), and the later end counts.
func TestANewInstanceInABurnedIPv6RangeIsBurned(t *testing.T) {
	until := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	memory := &burnedAt{ip: "2001:db8:6:1:0:5::", until: until}
	r := &ProxyReconciler{Burned: memory}
	inst := instance(providers.StateRunning, testHash, testUID)
	inst.IPv6Prefix = "2001:db8:6:1:0:5::/96"
	o := observation{proxy: proxyFixture(creatingRecorded), instance: inst, instanceProvider: "kind-local", desiredHash: testHash,
		maxRerolls: DefaultMaxBurnedIPRerolls}
	r.checkBurned(context.Background(), &o)
	require.NoError(t, o.burnedErr)
	assert.Equal(t, []string{inst.IP, "2001:db8:6:1:0:5::"}, memory.asked)
	assert.Equal(t, until, o.burnedUntil)
	assert.Equal(t, ReasonBurnedIP, plan(o).Cause, "replaced for its burned range")
}
