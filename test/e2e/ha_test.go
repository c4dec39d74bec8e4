package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
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

// replica is one operator process of a pair sharing a Redis.
type replica struct {
	name string
	opts cluster.OperatorOptions
	op   *cluster.Operator
}

func (r *replica) url() string { return "http://" + r.opts.DiscoveryAddr }

// do calls the replica's discovery API with the suite's token; a replica
// that does not answer at all fails the test.
func (r *replica) do(t *testing.T, method, path, body string) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, r.url()+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+world.token)
	c := http.Client{Timeout: 10 * time.Second}
	res, err := c.Do(req)
	require.NoError(t, err, "%s: %s %s", r.name, method, path)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := apiResponse{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out.body), "%s: %s %s: %s", r.name, method, path, raw)
	}
	return out
}

func (r *replica) start(t *testing.T) {
	t.Helper()
	op, err := world.cluster.StartOperator(world.bin, r.opts)
	require.NoError(t, err, r.name)
	r.op = op
}

// testSharedLeases: two operator processes share one real Redis and
// divide the probing, each holding its shard Lease. A lease
// made through one is renewed and released through the other; a cooldown
// reported to one holds on the other; SIGKILL of either loses no lease or
// cooldown while the other keeps answering; with Redis stopped both answer
// 503 store_unavailable fast, and both recover once it is back.
func testSharedLeases(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	redis := redisserver.Start(t, "redis-e2e-password")
	passwordFile := t.TempDir() + "/password"
	require.NoError(t, os.WriteFile(passwordFile, []byte(redis.Password+"\n"), 0o600))

	// The suite's single operator gives way to a leader-elected pair.
	world.operator.Stop()
	t.Cleanup(func() {
		var err error
		world.operator, err = world.cluster.StartOperator(world.bin, world.opts)
		require.NoError(t, err, "restarting the suite's operator")
	})
	pair := make([]*replica, 2)
	for i := range pair {
		pair[i] = &replica{name: fmt.Sprintf("replica-%d", i), opts: cluster.OperatorOptions{
			DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
			ExtraArgs: []string{"--leader-elect", "--lease-store=redis", "--redis-address=" + redis.Addr,
				"--redis-password-file=" + passwordFile, "--lease-store-timeout=300ms", "--rate-limit-cooldown=1s",
				"--health-shard-probes"},
		}}
		pair[i].start(t)
		r := pair[i]
		t.Cleanup(func() { r.op.Stop() })
	}
	a, b := pair[0], pair[1]

	ns := namespace(t)
	proxy := managed(ns, "shared")
	require.NoError(t, c.Create(ctx, proxy))
	waitProxy(t, client.ObjectKeyFromObject(proxy), "Ready and Healthy", readyAndHealthy)
	require.Eventually(t, func() bool {
		var leases coordinationv1.LeaseList
		err := c.List(ctx, &leases, client.MatchingLabels{shard.LabelGroup: "egress-proxies-operator-probes"})
		return err == nil && len(leases.Items) == 2
	}, waitFor, poll, "each replica holds its shard Lease")
	selector := fmt.Sprintf(`{"selector":{"suite":%q},"target":"shop.example","ttlSeconds":60}`, ns)
	// Every replica serves from its own view: wait until b's has the proxy.
	require.Eventually(t, func() bool {
		r := b.do(t, "GET", "/v1/proxies?healthy=true&suite="+ns, "")
		list, _ := r.body["proxies"].([]any)
		return r.status == http.StatusOK && len(list) == 1
	}, waitFor, poll, "the second replica's view serves the proxy")

	// A lease through one replica is the other's to renew and release.
	lease := a.do(t, "POST", "/v1/leases", selector)
	require.Equal(t, http.StatusCreated, lease.status, "%v", lease.body)
	id := lease.body["leaseID"].(string)
	got := b.do(t, "GET", "/v1/leases/"+id, "")
	require.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, leaseProxy(lease), leaseProxy(got))
	assert.EqualValues(t, 1, got.body["proxy"].(map[string]any)["activeLeases"], "the count is shared too")
	renewed := b.do(t, "POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds":120}`)
	require.Equal(t, http.StatusOK, renewed.status)
	assert.NotEqual(t, lease.body["expiresAt"], renewed.body["expiresAt"])
	assert.Equal(t, renewed.body["expiresAt"], a.do(t, "GET", "/v1/leases/"+id, "").body["expiresAt"], "a sees b's renewal")
	assert.Equal(t, http.StatusNoContent, b.do(t, "DELETE", "/v1/leases/"+id, "").status)
	assert.Equal(t, http.StatusNotFound, a.do(t, "GET", "/v1/leases/"+id, "").status, "released through b, gone for a")

	// A cooldown reported to a holds on b, for that target only.
	lease = a.do(t, "POST", "/v1/leases", selector)
	require.Equal(t, http.StatusCreated, lease.status)
	id = lease.body["leaseID"].(string)
	require.Equal(t, http.StatusNoContent, a.do(t, "POST", "/v1/leases/"+id+"/report",
		`{"result":"rate_limited","target":"shop.example","retryAfterSeconds":600}`).status)
	refused := b.do(t, "POST", "/v1/leases", selector)
	require.Equal(t, http.StatusServiceUnavailable, refused.status)
	assert.Equal(t, "no_proxy_available", errorCodeOf(refused))
	assert.Contains(t, []string{"599", "600"}, refused.header.Get("Retry-After"), "the cooldown's end, on the store's clock")
	other := b.do(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"target":"news.example"}`, ns))
	require.Equal(t, http.StatusCreated, other.status, "another target is not cooling")

	// SIGKILL either replica: the other answers for everything at once.
	for _, kill := range []struct{ victim, survivor *replica }{{a, b}, {b, a}} {
		kill.victim.op.Kill()
		assert.Equal(t, http.StatusOK, kill.survivor.do(t, "GET", "/v1/leases/"+id, "").status, "the lease outlives %s", kill.victim.name)
		assert.Equal(t, http.StatusServiceUnavailable, kill.survivor.do(t, "POST", "/v1/leases", selector).status,
			"the cooldown outlives %s", kill.victim.name)
		assert.Equal(t, http.StatusOK, kill.survivor.do(t, "POST", "/v1/leases/"+other.body["leaseID"].(string)+"/renew", "").status)
		kill.victim.start(t)
		assert.Equal(t, http.StatusOK, kill.victim.do(t, "GET", "/v1/leases/"+id, "").status, "%s is back with the shared state", kill.victim.name)
	}

	// Redis away: both answer the documented 503 within the store timeout,
	// and both report not ready; then both recover without a restart.
	redis.Stop()
	for _, r := range pair {
		start := time.Now()
		res := r.do(t, "POST", "/v1/leases", selector)
		assert.Less(t, time.Since(start), 2*time.Second, "%s answers fast", r.name)
		assert.Equal(t, http.StatusServiceUnavailable, res.status, r.name)
		assert.Equal(t, "store_unavailable", errorCodeOf(res), r.name)
		assert.NotEmpty(t, res.header.Get("Retry-After"), r.name)
		assert.Equal(t, http.StatusServiceUnavailable, r.do(t, "GET", "/readyz", "").status, "%s is not ready without its store", r.name)
		status, err := httpStatus("http://" + r.opts.ProbeAddr + "/readyz")
		require.NoError(t, err)
		assert.Equal(t, http.StatusInternalServerError, status, "%s: the pod's readiness probe (the manager's /readyz) fails too", r.name)
	}
	require.NoError(t, redis.Start())
	for _, r := range pair {
		require.Eventually(t, func() bool {
			return r.do(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q}}`, ns)).status == http.StatusCreated
		}, 15*time.Second, poll, "%s leases again once Redis is back", r.name)
		assert.Equal(t, http.StatusOK, r.do(t, "GET", "/readyz", "").status)
	}
}

func errorCodeOf(r apiResponse) string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func httpStatus(url string) (int, error) {
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	_ = res.Body.Close()
	return res.StatusCode, nil
}
