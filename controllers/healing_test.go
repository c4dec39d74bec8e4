package controllers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

var healingNow = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func phase(ph crawlv1alpha1.ProxyPhase) func(*crawlv1alpha1.Proxy) {
	return func(p *crawlv1alpha1.Proxy) { p.Status.Phase = ph }
}

func statusUnhealthy(p *crawlv1alpha1.Proxy) {
	p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: "Timeout"})
}

// unhealthyFor is the engine's view of a proxy Unhealthy for d, one of
// probed proxies on its URL of which unhealthy fail.
func unhealthyFor(d time.Duration, unhealthy, probed int) *ProxyHealth {
	return &ProxyHealth{UnhealthySince: healingNow.Add(-d), URL: "https://probe.test/", Unhealthy: unhealthy, Probed: probed}
}

// TestPlanHealing covers the rows that make the fleet heal itself: a lost
// instance, a proxy Unhealthy too long, and the outage guard.
func TestPlanHealing(t *testing.T) {
	policy := ReplacementPolicy{After: 10 * time.Minute, MaxUnhealthyShare: 0.3}
	running := instance(providers.StateRunning, testHash, testUID)
	cases := []struct {
		name        string
		proxy       *crawlv1alpha1.Proxy
		instance    *providers.Instance
		health      *ProxyHealth
		policy      ReplacementPolicy
		pool        string
		wantType    ActionType
		wantPhase   crawlv1alpha1.ProxyPhase
		wantReason  string
		wantCause   string
		wantBudget  bool
		wantRecheck time.Duration
	}{
		{name: "a Ready proxy whose instance is gone is replaced at once", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceLost, wantCause: ReasonInstanceLost},
		{name: "a replacement whose old instance is gone creates its successor, still Replacing", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReplacing)),
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonCreating},
		{name: "the successor starting stays Replacing", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReplacing)),
			instance: instance(providers.StatePending, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonProvisioning},
		{name: "a new proxy starting is Provisioning", proxy: proxyFixture(phase(crawlv1alpha1.PhaseProvisioning)),
			instance: instance(providers.StatePending, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseProvisioning, wantReason: ReasonProvisioning},
		{name: "a Ready proxy's instance deleted behind its back, still stopping: replaced once it is gone", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: instance(providers.StateStopping, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceLost, wantCause: ReasonInstanceLost},
		{name: "the operator's own deletion stopping: wait, no second cause", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReplacing)),
			instance: instance(providers.StateStopping, testHash, testUID),
			wantType: ActionWait, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceStopping},
		{name: "a terminated VM is replaced", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: instance(providers.StateFailed, testHash, testUID),
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceFailed, wantCause: ReasonInstanceFailed},
		{name: "healthy: ready, nothing to look at", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)), instance: running,
			health: &ProxyHealth{URL: "https://probe.test/", Probed: 10}, policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning},
		{name: "Unhealthy for less than the period: ready, and looked at when it runs out", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(4*time.Minute, 1, 10), policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning, wantRecheck: 6 * time.Minute},
		{name: "Unhealthy for longer than the period: replaced, within the budget", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(11*time.Minute, 1, 10), policy: policy,
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonUnhealthy, wantCause: ReasonUnhealthy, wantBudget: true},
		{name: "exactly the period: replaced", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(10*time.Minute, 1, 10), policy: policy,
			wantType: ActionDelete, wantReason: ReasonUnhealthy, wantBudget: true, wantCause: ReasonUnhealthy, wantPhase: crawlv1alpha1.PhaseReplacing},
		{name: "replacement off (0): never replaced for failing probes", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Hour, 1, 10), policy: ReplacementPolicy{MaxUnhealthyShare: 0.3},
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning},
		{name: "40% of the proxies on the URL Unhealthy: the target is suspect, none replaced", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Hour, 4, 10), policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonProbeTargetSuspect, wantRecheck: DefaultHeldRecheck},
		{name: "exactly the share (3 of 10): not suspect, replaced", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Hour, 3, 10), policy: policy,
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonUnhealthy, wantCause: ReasonUnhealthy, wantBudget: true},
		{name: "two of two Unhealthy: too few to blame the target, replaced", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Hour, 2, 2), policy: policy,
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonUnhealthy, wantCause: ReasonUnhealthy, wantBudget: true},
		{name: "suspected: Unhealthy for less than the period: held, not counted down", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Minute, 4, 10), policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning, wantRecheck: DefaultHeldRecheck},
		{name: "Unhealthy in status, the engine not probing it yet (a restart): look again soon", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady), statusUnhealthy),
			instance: running, policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning, wantRecheck: DefaultHeldRecheck},
		{name: "healthy in status, the engine not probing it yet: nothing to look at", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, policy: policy,
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonInstanceRunning},
		{name: "a spec change beats health, within the budget: a rotation never takes the fleet down at once", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: instance(providers.StateRunning, "hash-old", testUID), health: unhealthyFor(time.Hour, 4, 10), policy: policy,
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonSpecChanged, wantCause: ReasonSpecChanged, wantBudget: true},
		{name: "a spec change of an instance not serving yet is not budgeted", proxy: proxyFixture(phase(crawlv1alpha1.PhaseProvisioning)),
			instance: instance(providers.StatePending, "hash-old", testUID), policy: policy,
			wantType: ActionDelete, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonSpecChanged, wantCause: ReasonSpecChanged},
		{name: "a pool member Unhealthy too long is marked, not replaced: its pool replaces it under the pool's budget", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(11*time.Minute, 1, 10), policy: policy, pool: "eu",
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonUnhealthy, wantRecheck: DefaultHeldRecheck},
		{name: "a pool member in a suspected outage is held like any proxy", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			instance: running, health: unhealthyFor(time.Hour, 4, 10), policy: policy, pool: "eu",
			wantType: ActionMarkReady, wantPhase: crawlv1alpha1.PhaseReady, wantReason: ReasonProbeTargetSuspect, wantRecheck: DefaultHeldRecheck},
		{name: "a pool member whose instance is lost is still recreated in place: it serves nothing", proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)),
			policy: policy, pool: "eu",
			wantType: ActionCreate, wantPhase: crawlv1alpha1.PhaseReplacing, wantReason: ReasonInstanceLost, wantCause: ReasonInstanceLost},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := plan(observation{proxy: tc.proxy, instance: tc.instance, instanceProvider: "gcp-eu", desiredHash: testHash,
				now: healingNow, health: tc.health, replacement: tc.policy, pool: tc.pool})
			assert.Equal(t, tc.wantType, got.Type)
			assert.Equal(t, tc.wantPhase, got.Phase)
			assert.Equal(t, tc.wantReason, got.Reason)
			assert.Equal(t, tc.wantCause, got.Cause)
			assert.Equal(t, tc.wantBudget, got.Budgeted)
			assert.Equal(t, tc.wantRecheck, got.Recheck)
			assert.NotEmpty(t, got.Message)
			if got.Reason == ReasonProbeTargetSuspect {
				assert.NotContains(t, got.Message, "4 of", "the held message is written to status: no counts that change with every verdict")
				assert.Contains(t, got.Message, "https://probe.test/")
			}
		})
	}
}

// TestPlanAfterAnOutage: as the fleet recovers, the share falls below the
// bound before the last proxies are probed again; their time Unhealthy
// counts from the end of the suspicion, so none is replaced for the outage.
func TestPlanAfterAnOutage(t *testing.T) {
	policy := ReplacementPolicy{After: 10 * time.Minute, MaxUnhealthyShare: 0.3}
	h := unhealthyFor(20*time.Minute, 2, 10)
	h.LastSuspect = healingNow.Add(-time.Minute)
	o := observation{proxy: proxyFixture(phase(crawlv1alpha1.PhaseReady)), instance: instance(providers.StateRunning, testHash, testUID),
		instanceProvider: "gcp-eu", desiredHash: testHash, now: healingNow, replacement: policy, health: h}
	got := plan(o)
	assert.Equal(t, ActionMarkReady, got.Type, "Unhealthy for 20m, but 19 of them during a suspected outage")
	assert.Equal(t, 9*time.Minute, got.Recheck)

	h.LastSuspect = healingNow.Add(-11 * time.Minute)
	assert.Equal(t, ActionDelete, plan(o).Type, "Unhealthy for 11m since the suspicion ended: replaced")

	h.LastSuspect = time.Time{}
	assert.Equal(t, ActionDelete, plan(o).Type, "never suspect: Unhealthy for 20m counts whole")
}

func TestTargetSuspect(t *testing.T) {
	for _, tc := range []struct {
		unhealthy, probed int
		share             float64
		want              bool
	}{
		{0, 0, 0.3, false}, {1, 1, 0.3, false}, {2, 2, 0.3, false}, {3, 3, 0.3, true},
		{3, 10, 0.3, false}, {4, 10, 0.3, true}, {30, 100, 0.3, false}, {31, 100, 0.3, true},
		{10, 10, 1, false}, {5, 10, 0.49, true},
	} {
		assert.Equal(t, tc.want, targetSuspect(tc.unhealthy, tc.probed, tc.share), "%d of %d at %g", tc.unhealthy, tc.probed, tc.share)
	}
}

// TestNextStatusRecordsTheInstanceSeen: whatever an earlier pass failed to
// record, a pass that sees an instance records its name, provider and hash,
// even while it only waits for it.
func TestNextStatusRecordsTheInstanceSeen(t *testing.T) {
	p := proxyFixture(phase(crawlv1alpha1.PhaseProvisioning)) // the Create record was lost: nothing recorded
	inst := instance(providers.StatePending, testHash, testUID)
	o := observation{proxy: p, instance: inst, instanceProvider: "gcp-eu", desiredHash: testHash, now: healingNow}
	a := plan(o)
	require.Equal(t, ActionWait, a.Type)
	s := nextStatus(p, o, a)
	assert.Equal(t, inst.Name, s.InstanceName)
	assert.Equal(t, "gcp-eu", s.Provider)
	assert.Equal(t, testHash, s.SpecHash)
}

// TestReplacementBudget: the bound counts what the cache shows Replacing
// and what was admitted that it does not show yet, once each.
func TestReplacementBudget(t *testing.T) {
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "crawl", Name: name} }
	none := sets.New[types.NamespacedName]()
	n, ok := admit(none, key("a"), 2)
	assert.True(t, ok)
	assert.Equal(t, 1, n)
	n, ok = admit(sets.New(key("a"), key("b")), key("c"), 2)
	assert.False(t, ok, "the bound is taken")
	assert.Equal(t, 2, n)
	_, ok = admit(sets.New(key("a"), key("b")), key("a"), 2)
	assert.True(t, ok, "one already in flight carries on")

	r := &ProxyReconciler{Clock: clocktesting.NewFakePassiveClock(healingNow)}
	r.cache().tracker.Wrote(lagKey(lagReplacement, key("a")), "1", replacementOn("gcp-eu"))
	r.cache().tracker.Wrote(lagKey(lagReplacement, key("b")), "1", replacementOn("gcp-us"))
	pending := r.cache().tracker.Pending(func(p any) bool { return p == replacementOn("gcp-eu") })
	require.Len(t, pending, 1, "another provider instance has its own bound")
	r.releaseReplacement(key("a"))
	assert.Empty(t, r.cache().tracker.Pending(func(p any) bool { return p == replacementOn("gcp-eu") }), "released: its place is free at once")
}

func TestInstanceDiffers(t *testing.T) {
	p := proxyFixture(phase(crawlv1alpha1.PhaseReady), func(p *crawlv1alpha1.Proxy) {
		p.Status.IP, p.Status.Port, p.Status.SpecHash = "127.0.0.10", 3128, testHash
	})
	running := instance(providers.StateRunning, testHash, testUID)
	assert.Empty(t, instanceDiffers(p, running, true))
	assert.Contains(t, instanceDiffers(p, nil, false), "not listed")
	assert.Contains(t, instanceDiffers(p, instance(providers.StateFailed, testHash, testUID), true), "Failed")
	assert.Contains(t, instanceDiffers(p, instance(providers.StateStopping, testHash, testUID), true), "Stopping")
	assert.Contains(t, instanceDiffers(p, instance(providers.StateRunning, testHash, "uid-2"), true), "another Proxy")
	assert.Contains(t, instanceDiffers(p, instance(providers.StateRunning, "hash-old", testUID), true), "another spec")
	moved := instance(providers.StateRunning, testHash, testUID)
	moved.IP = "127.0.0.99"
	assert.Contains(t, instanceDiffers(p, moved, true), "127.0.0.99")
}
