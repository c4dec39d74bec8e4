package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	out, err := r.try(method, path, body)
	require.NoError(t, err)
	return out
}

// try is do for a goroutine of the test's: an error instead of a failure.
func (r *replica) try(method, path, body string) (apiResponse, error) {
	req, err := http.NewRequest(method, r.url()+path, bytes.NewBufferString(body))
	if err != nil {
		return apiResponse{}, err
	}
	req.Header.Set("Authorization", "Bearer "+world.token)
	c := http.Client{Timeout: 10 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		return apiResponse{}, fmt.Errorf("%s: %s %s: %w", r.name, method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	out := apiResponse{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			return out, fmt.Errorf("%s: %s %s: %s: %w", r.name, method, path, raw, err)
		}
	}
	return out, nil
}

func (r *replica) start(t *testing.T) {
	t.Helper()
	op, err := world.cluster.StartOperator(world.bin, r.opts)
	require.NoError(t, err, r.name)
	r.op = op
}

// startPair has the suite's single operator give way (until t ends) to a
// leader-elected pair, replica i with args(i) and a metrics address of its
// own (plain HTTP); it returns the pair and their metrics URLs.
func startPair(t *testing.T, args func(i int) []string) ([]*replica, []string) {
	t.Helper()
	world.operator.Stop()
	t.Cleanup(func() {
		var err error
		world.operator, err = world.cluster.StartOperator(world.bin, world.opts)
		require.NoError(t, err, "restarting the suite's operator")
	})
	pair := make([]*replica, 2)
	metrics := make([]string, len(pair))
	for i := range pair {
		metricsAddr := cluster.FreeAddr()
		metrics[i] = "http://" + metricsAddr + "/metrics"
		pair[i] = &replica{name: fmt.Sprintf("replica-%d", i), opts: cluster.OperatorOptions{
			DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
			ExtraArgs: append([]string{"--leader-elect", "--metrics-bind-address=" + metricsAddr, "--metrics-secure=false"}, args(i)...),
		}}
		pair[i].start(t)
		r := pair[i]
		t.Cleanup(func() { r.op.Stop() })
	}
	return pair, metrics
}

// testSharedLeases: two operator processes share one real Redis and
// divide the probing, each holding its shard Lease. A proxy without a lease
// is probed at the idle interval, and at the interval again once a lease
// through either replica holds it (the prober reads the shared store). A lease
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

	pair, metrics := startPair(t, func(int) []string {
		return []string{"--lease-store=redis", "--redis-address=" + redis.Addr,
			"--redis-password-file=" + passwordFile, "--lease-store-timeout=300ms", "--rate-limit-cooldown=1s",
			"--health-shard-probes", "--health-idle-interval=5s"}
	})
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

	// Idle (no lease), the proxy is probed every 5s, not every second:
	// one or two probes in 6s, by whichever replica owns it.
	require.Eventually(t, func() bool {
		n := probesWithin(t, metrics, ns, proxy.Name, 6*time.Second)
		return n >= 1 && n <= 2
	}, 40*time.Second, poll, "an idle proxy is probed at --health-idle-interval")

	// A lease through one replica is the other's to renew and release.
	lease := a.do(t, "POST", "/v1/leases", selector)
	require.Equal(t, http.StatusCreated, lease.status, "%v", lease.body)
	id := lease.body["leaseID"].(string)
	got := b.do(t, "GET", "/v1/leases/"+id, "")
	require.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, leaseProxy(lease), leaseProxy(got))
	assert.EqualValues(t, 1, got.body["proxy"].(map[string]any)["activeLeases"], "the count is shared too")
	require.Eventually(t, func() bool { return probesWithin(t, metrics, ns, proxy.Name, 3*time.Second) >= 2 }, 20*time.Second, poll,
		"leased, the proxy is probed every second again")
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

// testLosingTheRedisPrimary: the operator on a real primary, replica and
// Sentinel (--redis-sentinel-addresses, --redis-wait-replicas=1), under
// lease load through the discovery API, loses its primary to SIGKILL.
// Leases are granted again within 10s, on the promoted replica; the two
// exclusive holds taken before the kill are never granted again while
// they run; and the plain leases lost (their GET answers 404 before their
// TTL) are counted, printed, and all among those granted within the last
// second before the primary died, as docs/reliability.md says.
func testLosingTheRedisPrimary(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	primary := redisserver.Start(t, "")
	standby := redisserver.StartReplica(t, primary.Addr)
	sentinel := redisserver.StartSentinel(t, "leases", primary.Addr, time.Second)
	sentinels := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
	t.Cleanup(func() { _ = sentinels.Close() })
	require.Eventually(t, func() bool {
		replicas, err := sentinels.Replicas(ctx, "leases").Result()
		return err == nil && len(replicas) == 1 && replicas[0]["master-link-status"] == "ok"
	}, waitFor, poll, "the Sentinel knows the replica, in sync")

	world.operator.Stop()
	t.Cleanup(func() {
		var err error
		world.operator, err = world.cluster.StartOperator(world.bin, world.opts)
		require.NoError(t, err, "restarting the suite's operator")
	})
	r := &replica{name: "sentinel-operator", opts: cluster.OperatorOptions{
		DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
		ExtraArgs: []string{"--lease-store=redis", "--redis-sentinel-addresses=" + sentinel.Addr, "--redis-sentinel-master=leases",
			"--redis-wait-replicas=1", "--lease-store-timeout=1s"},
	}}
	r.start(t)
	t.Cleanup(func() { r.op.Stop() })

	ns := namespace(t)
	var keys []client.ObjectKey
	for i, group := range []string{"plain", "plain", "held", "held"} {
		p := managed(ns, fmt.Sprintf("px-%d", i))
		p.Spec.Attributes["group"] = group
		require.NoError(t, c.Create(ctx, p))
		keys = append(keys, client.ObjectKeyFromObject(p))
	}
	for _, key := range keys {
		waitProxy(t, key, "Ready and Healthy", readyAndHealthy)
	}
	require.Eventually(t, func() bool {
		res := r.do(t, "GET", "/v1/proxies?healthy=true&suite="+ns, "")
		list, _ := res.body["proxies"].([]any)
		return res.status == http.StatusOK && len(list) == len(keys)
	}, waitFor, poll, "discovery serves the four proxies")

	held := map[string]string{} // proxy -> its exclusive lease
	for range 2 {
		res := r.do(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q,"group":"held"},"exclusive":true,"ttlSeconds":120}`, ns))
		require.Equal(t, http.StatusCreated, res.status, "%v", res.body)
		held[leaseProxy(res)] = res.body["leaseID"].(string)
	}
	require.Len(t, held, 2, "each held proxy has its exclusive lease")

	type grant struct {
		id string
		at time.Time
	}
	var (
		mu        sync.Mutex
		grants    []grant
		killedAt  time.Time
		resumedAt time.Time
		refused   = map[string]int{}
		twice     []string
	)
	load, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for load.Err() == nil {
				sent := time.Now()
				res, err := r.try("POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q,"group":"plain"},"ttlSeconds":120}`, ns))
				now := time.Now()
				mu.Lock()
				switch {
				case err != nil:
					refused[err.Error()]++
				case res.status == http.StatusCreated:
					grants = append(grants, grant{res.body["leaseID"].(string), now})
					if !killedAt.IsZero() && sent.After(killedAt) && resumedAt.IsZero() {
						resumedAt = now
					}
				default:
					refused[fmt.Sprintf("%d %s", res.status, errorCodeOf(res))]++
				}
				mu.Unlock()
				again, err := r.try("POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q,"group":"held"},"exclusive":true,"ttlSeconds":60}`, ns))
				if err == nil && again.status == http.StatusCreated {
					mu.Lock()
					twice = append(twice, fmt.Sprintf("%s granted again exclusively at %s", leaseProxy(again), time.Now().Format(time.RFC3339Nano)))
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	mu.Lock()
	killedAt = time.Now()
	before := len(grants)
	mu.Unlock()
	primary.Stop()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !resumedAt.IsZero()
	}, 30*time.Second, poll, "leases are granted again after the failover")
	time.Sleep(2 * time.Second) // more leases on the new primary
	stop()
	wg.Wait()

	var lost []string
	for _, g := range grants {
		if res := r.do(t, "GET", "/v1/leases/"+g.id, ""); res.status == http.StatusNotFound {
			lost = append(lost, fmt.Sprintf("%s granted %s before the kill", g.id, killedAt.Sub(g.at).Round(time.Millisecond)))
			assert.Less(t, killedAt.Sub(g.at), time.Second, "a lease lost to the failover was granted in the last second before it")
		}
	}
	for proxy, id := range held {
		assert.Equal(t, http.StatusOK, r.do(t, "GET", "/v1/leases/"+id, "").status, "the exclusive hold on %s outlives the failover", proxy)
	}
	t.Logf("primary killed after %d leases; granted again %s after the kill; leases lost: %d of %d granted (%v); refusals meanwhile: %v",
		before, resumedAt.Sub(killedAt).Round(time.Millisecond), len(lost), len(grants), lost, refused)
	assert.Less(t, resumedAt.Sub(killedAt), 10*time.Second, "writes resume within 10s")
	assert.Empty(t, twice, "an exclusive hold is never granted twice")
	assert.Greater(t, len(grants), before, "leases were granted after the failover too")
	master, err := sentinels.GetMasterAddrByName(ctx, "leases").Result()
	require.NoError(t, err)
	assert.Equal(t, standby.Addr, net.JoinHostPort(master[0], master[1]), "the Sentinel promoted the replica")
}

// probesWithin counts the probes of proxy ns/name that either replica's
// proxy_operator_healthcheck_last_timestamp_seconds shows over window (each
// replica exports its own share; a replica not up counts nothing): the
// last probe times it reads that it did not read at the window's start.
func probesWithin(t *testing.T, metricsURLs []string, ns, name string, window time.Duration) int {
	t.Helper()
	var before map[time.Time]bool
	seen := map[time.Time]bool{}
	for start := time.Now(); time.Since(start) < window; time.Sleep(100 * time.Millisecond) {
		for _, url := range metricsURLs {
			if at, ok := lastProbe(url, ns, name); ok && !before[at] {
				seen[at] = true
			}
		}
		if before == nil {
			before, seen = seen, map[time.Time]bool{}
		}
	}
	return len(seen)
}

// lastProbe reads when the replica at metricsURL last probed proxy ns/name
// (proxy_operator_healthcheck_last_timestamp_seconds); false when it does
// not probe it.
func lastProbe(metricsURL, ns, name string) (time.Time, bool) {
	families, err := cluster.ScrapeMetrics(metricsURL)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range families["proxy_operator_healthcheck_last_timestamp_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] == ns && labels["name"] == name {
			return time.Unix(0, int64(m.GetGauge().GetValue()*float64(time.Second))), true
		}
	}
	return time.Time{}, false
}
