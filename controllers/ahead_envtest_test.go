package controllers

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// externalProxy is an External Proxy at ip:3128.
func externalProxy(ns, name, ip string) *crawlv1alpha1.Proxy {
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128,
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
	}
}

// scriptedAhead plays the health engine's probes ahead: it records what it
// was asked, answers not done until released, then the verdict it holds.
type scriptedAhead struct {
	mu       sync.Mutex
	asked    []crawlv1alpha1.ProxyStatus
	released bool
	verdict  FirstVerdict
}

func (s *scriptedAhead) probeAhead(p *crawlv1alpha1.Proxy) (FirstVerdict, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, *p.Status.DeepCopy())
	return s.verdict, s.released
}

func (s *scriptedAhead) release(v FirstVerdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released, s.verdict = true, v
}

func (s *scriptedAhead) lastAsked() (crawlv1alpha1.ProxyStatus, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.asked) == 0 {
		return crawlv1alpha1.ProxyStatus{}, 0
	}
	return s.asked[len(s.asked)-1], len(s.asked)
}

// statusWrites counts the updates to one Proxy seen by a watch started
// before it exists.
func statusWrites(t *testing.T, ns, name string) func() int {
	t.Helper()
	updates := proxyUpdates(t, ns, name)
	return func() int { return len(updates()) }
}

// TestFirstVerdictRecordedWithTheAddress: the reconciler writes nothing for a
// new address until the health engine has probed it, then records the
// address and a passing verdict in one write: the proxy goes from no status
// to Ready in one update. A probe that did not pass is recorded as a verdict
// awaited, for the engine to give.
func TestFirstVerdictRecordedWithTheAddress(t *testing.T) {
	env := testenv.Shared(t)
	op := startHealingOperator(t, env, func(c client.Client) providers.Set { return kubernetesProviders(t, c) }, ReplacementPolicy{}, 0)
	c := env.Client
	ctx := context.Background()

	t.Run("a passing first probe: Ready in one write", func(t *testing.T) {
		ns := env.Namespace(t)
		ahead := &scriptedAhead{}
		op.health.setAhead(ahead.probeAhead)
		updates := statusWrites(t, ns, "ext")
		proxy := externalProxy(ns, "ext", "127.0.0.31")
		require.NoError(t, c.Create(ctx, proxy))

		require.Eventually(t, func() bool { _, n := ahead.lastAsked(); return n > 0 }, 5*time.Second, 10*time.Millisecond,
			"the reconciler asks for the address to be probed")
		asked, _ := ahead.lastAsked()
		assert.Equal(t, "127.0.0.31", asked.IP, "the probe is of the address about to be recorded")
		assert.Equal(t, crawlv1alpha1.PhaseReady, asked.Phase)
		require.Never(t, func() bool { return updates() > 0 }, 500*time.Millisecond, 20*time.Millisecond,
			"nothing is written while the first probe runs")

		at := time.Now().Truncate(time.Second)
		ahead.release(FirstVerdict{At: at, Healthy: &metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue,
			Reason: "ProbeSucceeded", Message: "probed through the proxy", LastTransitionTime: metav1.NewTime(at)}})
		op.trigger(proxy)
		ready := waitReady(t, c, proxy)
		assert.True(t, meta.IsStatusConditionTrue(ready.Status.Conditions, crawlv1alpha1.ConditionHealthy))
		assert.True(t, meta.IsStatusConditionTrue(ready.Status.Conditions, crawlv1alpha1.ConditionProvisioned))
		require.NotNil(t, ready.Status.LastHealthCheckTime)
		assert.Equal(t, at.Unix(), ready.Status.LastHealthCheckTime.Unix(), "the probe's time is the last health check")
		assert.Equal(t, "127.0.0.31", ready.Status.IP)
		time.Sleep(300 * time.Millisecond) // give a second write the chance to show
		assert.Equal(t, 1, updates(), "from no status to Ready in one write")
	})

	t.Run("a first probe that did not pass: the verdict is awaited", func(t *testing.T) {
		ns := env.Namespace(t)
		ahead := &scriptedAhead{}
		ahead.release(FirstVerdict{At: time.Now()})
		op.health.setAhead(ahead.probeAhead)
		proxy := externalProxy(ns, "ext", "127.0.0.32")
		require.NoError(t, c.Create(ctx, proxy))
		p := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.IP != "" })
		healthy := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy)
		require.NotNil(t, healthy)
		assert.Equal(t, metav1.ConditionUnknown, healthy.Status)
		assert.Equal(t, crawlv1alpha1.ReasonAwaitingProbe, healthy.Reason)
		assert.False(t, meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady))
		assert.Nil(t, p.Status.LastHealthCheckTime, "no verdict, no health check time: the engine's first verdict is still to come")
	})
}
