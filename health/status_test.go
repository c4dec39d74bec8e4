package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// TestHealthPartFor: what the engine writes of a Proxy's status, and when,
// from what the reconciler recorded and what the engine knows.
func TestHealthPartFor(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	serving := func() *crawlv1alpha1.Proxy {
		p := &crawlv1alpha1.Proxy{}
		p.Name, p.Namespace, p.Generation = "a", "ns", 1
		p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.1", Port: 3128, InstanceName: "px-a", SpecHash: "h"}
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "InstanceRunning"})
		return p
	}
	judged := func(p *crawlv1alpha1.Proxy, v Verdict) *crawlv1alpha1.Proxy {
		k := knowledge{instance: p.Status.Instance(), verdict: v, decidedAt: now.Add(-time.Minute), probed: true}
		part, stale := healthPartFor(p, &k, now.Add(-time.Minute))
		require.True(t, stale)
		p.Status.HealthCheckedInstance, p.Status.LastHealthCheckTime = part.instance, part.lastCheck
		meta.SetStatusCondition(&p.Status.Conditions, part.healthy)
		meta.SetStatusCondition(&p.Status.Conditions, part.ready)
		return p
	}
	healthy := func() *crawlv1alpha1.Proxy { return judged(serving(), Healthy) }

	t.Run("a new proxy's first verdict: Healthy and Ready in one write", func(t *testing.T) {
		p := serving()
		k := knowledge{instance: p.Status.Instance(), verdict: Healthy, decided: Result{Success: true, Message: "204"}, decidedAt: now, probed: true}
		part, stale := healthPartFor(p, &k, now)
		require.True(t, stale)
		assert.Equal(t, metav1.ConditionTrue, part.healthy.Status)
		assert.Equal(t, metav1.ConditionTrue, part.ready.Status)
		assert.Equal(t, p.Status.Instance(), part.instance)
		assert.Equal(t, now.Unix(), part.lastCheck.Unix())
	})
	t.Run("awaiting the first probe, nothing stored: nothing to write", func(t *testing.T) {
		p := serving()
		k := knowledge{instance: p.Status.Instance()}
		_, stale := healthPartFor(p, &k, now)
		assert.False(t, stale, "the first probe, due now, writes")
	})
	t.Run("recorded already: nothing to write", func(t *testing.T) {
		p := healthy()
		k := knowledge{instance: p.Status.Instance(), verdict: Healthy, decidedAt: now.Add(-time.Minute), probed: true}
		_, stale := healthPartFor(p, &k, now)
		assert.False(t, stale)
	})
	t.Run("a new address under a verdict about the old: reset before any probe", func(t *testing.T) {
		p := healthy()
		p.Status.IP = "127.0.0.2"
		assert.False(t, p.IsReady(), "the rule already refuses a verdict about another instance")
		k := knowledge{instance: p.Status.Instance()}
		part, stale := healthPartFor(p, &k, now)
		require.True(t, stale, "a stored Ready=True is misleading")
		assert.Equal(t, metav1.ConditionUnknown, part.healthy.Status)
		assert.Equal(t, crawlv1alpha1.ReasonAwaitingProbe, part.ready.Reason)
		assert.Equal(t, metav1.ConditionFalse, part.ready.Status)
	})
	t.Run("not serving any more: no verdict holds", func(t *testing.T) {
		p := healthy()
		p.Status.Phase, p.Status.IP, p.Status.Port = crawlv1alpha1.PhaseReplacing, "", 0
		part, stale := healthPartFor(p, nil, now)
		require.True(t, stale)
		assert.Equal(t, metav1.ConditionUnknown, part.healthy.Status)
		assert.Equal(t, crawlv1alpha1.ReasonNotServing, part.healthy.Reason)
		assert.Equal(t, crawlv1alpha1.ReasonNotProvisioned, part.ready.Reason)
		assert.Empty(t, part.instance)
		require.NotNil(t, part.lastCheck, "the last check stays on record")

		meta.SetStatusCondition(&p.Status.Conditions, part.healthy)
		meta.SetStatusCondition(&p.Status.Conditions, part.ready)
		p.Status.HealthCheckedInstance = part.instance
		_, stale = healthPartFor(p, nil, now.Add(time.Minute))
		assert.False(t, stale, "once written, nothing more to write")
	})
	t.Run("never served, nothing stored: nothing to write", func(t *testing.T) {
		p := serving()
		p.Status.Phase, p.Status.IP = crawlv1alpha1.PhaseProvisioning, ""
		_, stale := healthPartFor(p, nil, now)
		assert.False(t, stale)
	})
	t.Run("Unhealthy: Ready False with the verdict's message", func(t *testing.T) {
		p := healthy()
		k := knowledge{instance: p.Status.Instance(), verdict: Unhealthy, decided: Result{Reason: ReasonConnectRefused, Message: "refused"}, decidedAt: now, probed: true}
		part, stale := healthPartFor(p, &k, now)
		require.True(t, stale)
		assert.Equal(t, metav1.ConditionFalse, part.healthy.Status)
		assert.Equal(t, ReasonConnectRefused, part.healthy.Reason)
		assert.Equal(t, crawlv1alpha1.ReasonNotHealthy, part.ready.Reason)
		assert.Equal(t, "refused", part.ready.Message)
	})
	t.Run("a verdict written before verdicts named their instance: kept, and named", func(t *testing.T) {
		p := healthy()
		p.Status.HealthCheckedInstance = ""
		assert.True(t, p.IsReady(), "an upgrade does not take the fleet out of service")
		recorded, _, _ := recordedVerdict(p)
		require.Equal(t, Healthy, recorded, "the engine starts from it")
		k := knowledge{instance: p.Status.Instance(), verdict: recorded, decidedAt: p.Status.LastHealthCheckTime.Time, probed: true}
		part, stale := healthPartFor(p, &k, now)
		require.True(t, stale, "the engine names the instance in one write")
		assert.Equal(t, p.Status.Instance(), part.instance)
		assert.Equal(t, metav1.ConditionTrue, part.ready.Status)
		p.Status.HealthCheckedInstance = part.instance
		_, stale = healthPartFor(p, &k, now)
		assert.False(t, stale, "named once, nothing more to write")
	})
	t.Run("deleting: nothing to write", func(t *testing.T) {
		p := healthy()
		p.DeletionTimestamp = &metav1.Time{Time: now}
		_, stale := healthPartFor(p, nil, now)
		assert.False(t, stale)
	})
}
