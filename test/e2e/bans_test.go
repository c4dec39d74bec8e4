package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/bans"
)

// leaseEach holds one lease on each of the pool's n members (no target:
// least-loaded spreads them), returning lease ids by member id.
func leaseEach(t *testing.T, ns string, n int) map[string]string {
	t.Helper()
	out := map[string]string{}
	for range n {
		l := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"ttlSeconds":600}`, ns))
		require.Equal(t, http.StatusCreated, l.status, "%v", l.body)
		out[leaseProxy(l)] = l.body["leaseID"].(string)
	}
	require.Len(t, out, n, "one lease per member")
	return out
}

func reportBlocked(t *testing.T, lease string, hosts ...string) {
	t.Helper()
	for _, h := range hosts {
		r := api(t, "POST", "/v1/leases/"+lease+"/report", fmt.Sprintf(`{"result":"blocked","target":%q}`, h))
		require.Equal(t, http.StatusNoContent, r.status, "%v", r.body)
	}
}

func releaseAll(t *testing.T, leases map[string]string) {
	t.Helper()
	for _, id := range leases {
		api(t, "DELETE", "/v1/leases/"+id, "")
	}
}

// testBans: a pool member blocked on three hosts is banned, its IP burned
// and the member replaced under the pool's budget; an instance that later
// comes up on the burned IP is replaced before it serves. When one host
// blocks every member at once, the host is suspected and nobody is
// replaced.
func testBans(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client

	t.Run("a member banned on three hosts is replaced, and no successor serves on its IP", func(t *testing.T) {
		ns := namespace(t)
		pool := newPool(ns, "banned", 3)
		require.NoError(t, c.Create(ctx, pool))
		waitPool(t, pool, poolLongWait, "3 members available", settledAt(3))
		world.cluster.Runner.ReuseReleasedIPs(true)
		t.Cleanup(func() { world.cluster.Runner.ReuseReleasedIPs(false) })

		leases := leaseEach(t, ns, 3)
		var victim string
		for id := range leases {
			victim = id
			break
		}
		key := types.NamespacedName{Namespace: ns, Name: victim[len(ns)+1:]}
		var before crawlv1alpha1.Proxy
		require.NoError(t, c.Get(ctx, key, &before))
		burned, victimPod := before.Status.IP, podUIDOf(t, ns, key.Name)
		require.NotEmpty(t, victimPod)
		reportBlocked(t, leases[victim], "a.example", "b.example", "c.example")
		releaseAll(t, leases)

		require.Eventually(t, func() bool { return hasEvent(t, ns, key.Name, bans.EventBanned) }, waitFor, poll, "the Banned Event")
		waitPool(t, pool, poolLongWait, "the banned member replaced", func(p *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
			return settledAt(3)(p, ms) && !names(ms)[key.Name]
		})
		assert.True(t, hasEvent(t, ns, pool.Name, "MemberRetired"), "the pool says it retired the member")

		// The cloud hands the banned member's IP to the next instance it
		// makes: scale up, and the new member's first instance is on it.
		require.Eventually(t, func() bool { return !world.cluster.Runner.Running(victimPod) }, waitFor, poll, "the banned pod's Squid stopped")
		patchPool(t, pool, func(p *crawlv1alpha1.ProxyPool) { p.Spec.Replicas = ptr(int32(4)) })
		ms := members(t, waitPool(t, pool, poolLongWait, "4 members available", settledAt(4)))
		rerolled := ""
		for _, m := range ms {
			assert.NotEqual(t, burned, m.Status.IP, "member %s serves on the burned IP", m.Name)
			if hasEvent(t, ns, m.Name, "BurnedIP") {
				rerolled = m.Name
			}
		}
		assert.NotEmpty(t, rerolled, "a new instance came up on the burned IP %s and was replaced before it served", burned)
	})

	t.Run("one host blocking every member is suspected, and nobody is replaced", func(t *testing.T) {
		ns := namespace(t)
		pool := newPool(ns, "outage", 3)
		require.NoError(t, c.Create(ctx, pool))
		before := members(t, waitPool(t, pool, poolLongWait, "3 members available", settledAt(3)))
		leases := leaseEach(t, ns, 3)
		first := true
		for _, lease := range leases {
			reportBlocked(t, lease, "down.example")
			if first {
				// Without the guard this one would be banned: three hosts.
				reportBlocked(t, lease, "x.example", "y.example")
				first = false
			}
		}
		releaseAll(t, leases)
		require.Eventually(t, func() bool { return hasEvent(t, ns, pool.Name, bans.EventHostSuspect) }, waitFor, poll,
			"the pool's BlockingHostSuspect Event")
		after := members(t, pool)
		assert.Equal(t, names(before), names(after), "no member replaced")
		for _, m := range after {
			assert.Nil(t, meta.FindStatusCondition(m.Status.Conditions, crawlv1alpha1.ConditionBanned), "member %s was banned", m.Name)
			assert.False(t, hasEvent(t, ns, m.Name, bans.EventBanned))
		}
	})
}

// podUIDOf is the UID of a Proxy's pod (named after the Proxy's instance),
// "" once it is gone.
func podUIDOf(t *testing.T, ns, proxy string) types.UID {
	t.Helper()
	for _, pod := range proxyPods(t, ns) {
		if pod.Labels[crawlv1alpha1.LabelOwnerName] == proxy {
			return pod.UID
		}
	}
	return ""
}
