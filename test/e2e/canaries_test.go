package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/lease"
)

// testCanaries: a canary on a site that blocks the proxy records Blocked,
// keeps the proxy away from that host only (a lease for it is refused, one
// for another host goes to the proxy), shows in the proxy's outcomes, and
// never makes it Unhealthy. Its exit IP is its own address here, so no
// egressIP is recorded.
func testCanaries(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	proxy := managed(ns, "canaried")
	proxy.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{Targets: []crawlv1alpha1.CanaryTarget{
		{Name: "shop", URL: world.cluster.Target.BlockedURL, BlockedMarker: "Access denied"},
	}}
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)
	got := waitProxy(t, key, "Ready with the canary Blocked", func(p *crawlv1alpha1.Proxy) bool {
		return readyAndHealthy(p) && len(p.Status.Canaries) == 1 && p.Status.Canaries[0].Verdict == crawlv1alpha1.CanaryBlocked
	})
	u, err := url.Parse(world.cluster.Target.BlockedURL)
	require.NoError(t, err)
	host := u.Hostname()
	assert.Equal(t, "shop", got.Status.Canaries[0].Name)
	assert.Equal(t, host, got.Status.Canaries[0].Host)
	assert.Contains(t, got.Status.Canaries[0].Message, "403")
	assert.Empty(t, got.Status.EgressIP, "the echo saw the proxy's own address")

	refused := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"target":%q}`, ns, host))
	assert.Equal(t, http.StatusServiceUnavailable, refused.status, "the canary's host: the proxy cools down for it")
	other := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"target":"example.org"}`, ns))
	require.Equal(t, http.StatusCreated, other.status, "another host may still use it")
	assert.Equal(t, ns+"/canaried", leaseProxy(other))
	api(t, "DELETE", "/v1/leases/"+other.body["leaseID"].(string), "")

	shown := api(t, "GET", "/v1/proxies/"+ns+"/canaried", "")
	require.Equal(t, http.StatusOK, shown.status)
	outcomes, _ := shown.body["outcomes"].([]any)
	require.NotEmpty(t, outcomes)
	rec := outcomes[0].(map[string]any)
	assert.Equal(t, host, rec["host"])
	assert.Equal(t, lease.OutcomeCanary, rec["lastBlockedBy"])
	assert.False(t, hasEvent(t, ns, "canaried", "Unhealthy"), "a failing canary never makes a proxy Unhealthy")
}
