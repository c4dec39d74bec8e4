package e2e

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/shard"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/redisserver"
)

// testAskedProbesCrossReplicas: two replicas on one Redis divide the
// probing at a 30s interval, each with a gateway. A proxy's Squid dies
// between its probes; a tunnel through the gateway of the replica that
// does not probe it fails, and the replica that does probes it within
// seconds (the ask passed on through the lease store), not at its next
// turn.
func testAskedProbesCrossReplicas(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	redis := redisserver.Start(t, "")
	gateways := []string{cluster.FreeAddr(), cluster.FreeAddr()}
	_, metrics := startPair(t, func(i int) []string {
		return []string{"--lease-store=redis", "--redis-address=" + redis.Addr,
			"--health-shard-probes", "--health-interval=30s", "--gateway-bind-address=" + gateways[i]}
	})

	ns := namespace(t)
	proxy := managed(ns, "asked")
	require.NoError(t, c.Create(ctx, proxy))
	waitProxy(t, client.ObjectKeyFromObject(proxy), "Ready and Healthy", readyAndHealthy)
	require.Eventually(t, func() bool {
		var leases coordinationv1.LeaseList
		if err := c.List(ctx, &leases, client.MatchingLabels{shard.LabelGroup: "egress-proxies-operator-probes"}); err != nil {
			return false
		}
		live := 0 // the last scenario's replicas' Leases linger until they expire
		for _, l := range leases.Items {
			if l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < 5*time.Second {
				live++
			}
		}
		return live == 2
	}, waitFor, poll, "each replica holds its shard Lease")

	// The replica that probes the proxy is the one that exports its last
	// probe. Wait until that probe is more than the 10s an ask must wait
	// for, and its next (30s after it, less 10% jitter) is still far.
	owner := -1
	require.Eventually(t, func() bool {
		owner = -1
		var age time.Duration
		for i, m := range metrics {
			if at, ok := lastProbe(m, ns, proxy.Name); ok {
				if owner >= 0 {
					return false // handing over
				}
				owner, age = i, time.Since(at)
			}
		}
		return owner >= 0 && age > 11*time.Second && age < 16*time.Second
	}, time.Minute, 100*time.Millisecond, "one replica probes the proxy, last more than 11s ago")
	other := 1 - owner
	asked := func(i int) float64 {
		n, _ := seriesValue(t, metrics[i], "proxy_operator_healthcheck_asked_total", "via", "lease_store") // none yet: 0
		return n
	}
	before := asked(owner)

	pods := proxyPods(t, ns)
	require.Len(t, pods, 1)
	require.True(t, world.cluster.Runner.KillSquid(pods[0].UID), "the pod's Squid was running")
	gatewayURL := &url.URL{Scheme: "http", User: url.UserPassword("e2e-ask.suite-"+ns, world.token), Host: gateways[other]}
	crawler := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(gatewayURL), DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := crawler.Get(world.cluster.Target.URL)
	if err == nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err, "the only proxy's Squid is dead")
	assert.Contains(t, err.Error(), "Bad Gateway")

	require.Eventually(t, func() bool { return asked(owner) > before }, 5*time.Second, poll,
		"the replica that probes the proxy probes it on the other replica's tunnel's ask")
	assert.Zero(t, asked(other), "the other replica was asked nothing through the store")
}
