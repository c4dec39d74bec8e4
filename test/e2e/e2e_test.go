// Package e2e runs the operator binary as a process of its own against the
// local cluster harness (a real API server, real Squid proxies, a local HTTPS
// probe target) and drives it the way a user and a crawler would: kubectl-
// style object changes and HTTP calls to the discovery API.
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
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/geoip/geoiptest"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/squid"
)

const (
	waitFor = 60 * time.Second
	poll    = 100 * time.Millisecond
)

// world is what every e2e test shares.
var world struct {
	cluster   *cluster.Cluster
	bin       string
	operator  *cluster.Operator
	opts      cluster.OperatorOptions
	discovery string
	gateway   string
	token     string
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if _, err := squid.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if world.bin, err = cluster.BuildRaceOperator(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if world.cluster, err = cluster.Start(dir, cluster.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer world.cluster.Stop()
	world.token = "e2e-token"
	if err := world.cluster.Env.Client.Create(context.Background(), tokenSecret(world.token)); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: creating the token Secret:", err)
		return 1
	}
	world.gateway = cluster.FreeAddr()
	// A geo database that places every loopback exit IP in Frankfurt, on a
	// documentation ASN: testExternal reads it back.
	geoDB := filepath.Join(dir, "geo.mmdb")
	if err := geoiptest.Write(geoDB, map[string]geoip.Location{"127.0.0.0/8": e2eLocation}); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: writing the geo database:", err)
		return 1
	}
	world.opts = cluster.OperatorOptions{DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
		ExtraArgs: []string{"--geoip-database=" + geoDB, "--pool-autoscale-interval=1s", "--ban-check-interval=1s", "--canary-interval=10s", "--canary-host-interval=0s", "--gateway-bind-address=" + world.gateway, "--tenant-review-ttl=1s"}}
	world.discovery = "http://" + world.opts.DiscoveryAddr
	if world.operator, err = world.cluster.StartOperator(world.bin, world.opts); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	code := m.Run()
	world.operator.Stop()
	if races := world.cluster.DataRaces(); races != "" {
		fmt.Fprintf(os.Stderr, "e2e: the operator (built with -race) found data races:\n%s\n", races)
		code = 1
	}
	if code != 0 {
		if tail, err := readTail(world.operator.Log, 6000); err == nil {
			fmt.Fprintf(os.Stderr, "--- operator log (tail) ---\n%s\n", tail)
		}
	}
	return code
}

func tokenSecret(token string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.OperatorNamespace, Name: "discovery-token"},
		Data: map[string][]byte{"token": []byte(token)}}
}

// --- the API as a crawler sees it ---

type apiResponse struct {
	status int
	body   map[string]any
	header http.Header
}

func call(t *testing.T, method, path, body, token string) apiResponse {
	t.Helper()
	return callAt(t, world.discovery, method, path, body, token)
}

// callAt calls the discovery API at base (an operator other than the
// shared one's, say) with token, if any.
func callAt(t *testing.T, base, method, path, body, token string) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, base+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := apiResponse{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &r.body), "%s %s: %s", method, path, raw)
	}
	return r
}

func api(t *testing.T, method, path, body string) apiResponse {
	t.Helper()
	return call(t, method, path, body, world.token)
}

func leaseProxy(r apiResponse) string {
	p, _ := r.body["proxy"].(map[string]any)
	id, _ := p["id"].(string)
	return id
}

// --- objects as a user sees them ---

func namespace(t *testing.T) string {
	t.Helper()
	return world.cluster.Env.Namespace(t)
}

func get(t *testing.T, key client.ObjectKey) *crawlv1alpha1.Proxy {
	t.Helper()
	var p crawlv1alpha1.Proxy
	require.NoError(t, world.cluster.Env.Client.Get(context.Background(), key, &p))
	return &p
}

// waitProxy waits until cond holds for the Proxy and returns it.
func waitProxy(t *testing.T, key client.ObjectKey, what string, cond func(*crawlv1alpha1.Proxy) bool) *crawlv1alpha1.Proxy {
	t.Helper()
	return waitProxyIn(t, world.cluster, key, what, cond)
}

// waitProxyIn is waitProxy on cluster c.
func waitProxyIn(t *testing.T, c *cluster.Cluster, key client.ObjectKey, what string, cond func(*crawlv1alpha1.Proxy) bool) *crawlv1alpha1.Proxy {
	t.Helper()
	var last crawlv1alpha1.Proxy
	require.Eventually(t, func() bool {
		if err := c.Env.Client.Get(context.Background(), key, &last); err != nil {
			return false
		}
		return cond(&last)
	}, waitFor, poll, "%s: %s never happened; last status %+v", key, what, &last.Status)
	return &last
}

func healthyStatus(p *crawlv1alpha1.Proxy) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy); c != nil {
		return c.Status
	}
	return ""
}

func readyAndHealthy(p *crawlv1alpha1.Proxy) bool {
	return p.Status.Phase == crawlv1alpha1.PhaseReady && healthyStatus(p) == metav1.ConditionTrue &&
		meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady)
}

func proxyPods(t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, world.cluster.Env.Client.List(context.Background(), &pods, client.InNamespace(ns)))
	return pods.Items
}

func managed(ns, name string) *crawlv1alpha1.Proxy {
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: cluster.ProviderName, Port: crawlv1alpha1.DefaultPort,
			Attributes: map[string]string{"geo": "local", "suite": ns}},
	}
}

// TestE2E runs the scenarios in order: they share one operator, and the
// restart and auth scenarios change it.
func TestE2E(t *testing.T) {
	t.Run("quickstart", testQuickstart)
	t.Run("replacement", testReplacement)
	t.Run("self-healing", testSelfHealing)
	t.Run("pool", testPool)
	t.Run("pool autoscaling", testPoolAutoscaling)
	t.Run("bans", testBans)
	t.Run("canaries", testCanaries)
	t.Run("external", testExternal)
	t.Run("gateway", testGateway)
	t.Run("tenants", testTenants)
	t.Run("hostile tenant", testHostileTenant)
	t.Run("restart", testRestart)
	t.Run("shared leases on redis", testSharedLeases)
	t.Run("asked probes across replicas", testAskedProbesCrossReplicas)
	t.Run("losing the redis primary", testLosingTheRedisPrimary)
	t.Run("auth", testAuth)
	t.Run("security", testSecurity)
	t.Run("no password leaks", testNoPasswordLeaks)
}

func testQuickstart(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	proxy := managed(ns, "quickstart")
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)

	ready := waitProxy(t, key, "Ready and Healthy", readyAndHealthy)
	pods := proxyPods(t, ns)
	require.Len(t, pods, 1)
	pod := pods[0]
	assert.Equal(t, pod.Status.PodIP, ready.Status.IP, "status IP is the pod's")
	assert.True(t, world.cluster.Runner.Running(pod.UID), "a real Squid serves the pod")

	list := api(t, "GET", "/v1/proxies?healthy=true&suite="+ns, "")
	require.Equal(t, http.StatusOK, list.status)
	items := list.body["proxies"].([]any)
	require.Len(t, items, 1)
	assert.Equal(t, ns+"/quickstart", items[0].(map[string]any)["id"])
	item := items[0].(map[string]any)
	assert.Nil(t, item["password"], "a listing hands out no credentials: each lease gets its own")
	assert.Contains(t, item["credentialsWithheld"], "lease it")

	lease := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"ttlSeconds":300,"target":"example.com"}`, ns))
	require.Equal(t, http.StatusCreated, lease.status)
	assert.Equal(t, ns+"/quickstart", leaseProxy(lease))
	leased := lease.body["proxy"].(map[string]any)
	notePassword(leased["password"].(string))
	assert.Equal(t, fmt.Sprintf("http://%s:%s@%s:3128", leased["username"], leased["password"], pod.Status.PodIP), leased["url"],
		"an authenticated API hands out the URL with the lease's credentials")
	id := lease.body["leaseID"].(string)

	report := api(t, "POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"example.com"}`)
	assert.Equal(t, http.StatusNoContent, report.status)
	again := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"target":"example.com"}`, ns))
	assert.Equal(t, http.StatusServiceUnavailable, again.status, "the only proxy is cooling down for example.com")
	assert.NotEmpty(t, again.header.Get("Retry-After"))
	other := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"target":"example.org"}`, ns))
	require.Equal(t, http.StatusCreated, other.status, "another target may use it")

	for _, leaseID := range []string{id, other.body["leaseID"].(string)} {
		for range 2 {
			assert.Equal(t, http.StatusNoContent, api(t, "DELETE", "/v1/leases/"+leaseID, "").status, "release is idempotent")
		}
	}

	// A kubernetes Proxy has no finalizer (its pod is owned by it): it goes
	// at once, and the operator deletes the pod right after (envtest runs no
	// garbage collector).
	require.NoError(t, c.Delete(ctx, ready))
	assert.True(t, apierrors.IsNotFound(c.Get(ctx, key, &crawlv1alpha1.Proxy{})), "nothing holds the Proxy")
	require.Eventually(t, func() bool { return len(proxyPods(t, ns)) == 0 }, waitFor, poll, "the pod outlived its Proxy")
	require.Eventually(t, func() bool { return !world.cluster.Runner.Running(pod.UID) }, 10*time.Second, poll, "its Squid stopped")
}

func testReplacement(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	proxy := managed(ns, "replaced")
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)
	before := waitProxy(t, key, "Ready and Healthy", readyAndHealthy)
	oldPod := proxyPods(t, ns)[0]

	before.Spec.Port = 3129
	require.NoError(t, c.Update(ctx, before))
	after := waitProxy(t, key, "Ready and Healthy on port 3129", func(p *crawlv1alpha1.Proxy) bool {
		return readyAndHealthy(p) && p.Status.Port == 3129
	})
	pods := proxyPods(t, ns)
	require.Len(t, pods, 1)
	assert.Equal(t, oldPod.Name, pods[0].Name, "same name")
	assert.NotEqual(t, oldPod.UID, pods[0].UID, "new pod")
	assert.NotEqual(t, before.Status.IP, after.Status.IP, "new IP")
	assert.False(t, world.cluster.Runner.Running(oldPod.UID), "the old Squid stopped")
}

// testSelfHealing kills a proxy's real Squid for good: the real health
// engine finds it Unhealthy, the Events tell the story, the lease on it can
// no longer be renewed, and once it has failed for its replaceAfter the
// operator replaces it with a pod that serves again (same name, new IP).
func testSelfHealing(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	proxy := managed(ns, "sick")
	proxy.Spec.HealthCheck = &crawlv1alpha1.HealthCheck{ReplaceAfter: &metav1.Duration{Duration: 3 * time.Second}}
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)
	before := waitProxy(t, key, "Ready and Healthy", readyAndHealthy)
	oldPod := proxyPods(t, ns)[0]
	lease := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"ttlSeconds":300}`, ns))
	require.Equal(t, http.StatusCreated, lease.status)
	id := lease.body["leaseID"].(string)

	require.True(t, world.cluster.Runner.KillSquid(oldPod.UID), "the pod's Squid was running")
	waitProxy(t, key, "Unhealthy", func(p *crawlv1alpha1.Proxy) bool {
		return healthyStatus(p) == metav1.ConditionFalse || p.Status.IP != before.Status.IP
	})
	renew := api(t, "POST", "/v1/leases/"+id+"/renew", "")
	if renew.status != http.StatusNotFound { // a replaced proxy's lease may be gone with it
		assert.Equal(t, http.StatusConflict, renew.status, "a lease on a dead proxy is not renewed")
	}

	after := waitProxy(t, key, "replaced, Ready and Healthy at a new IP", func(p *crawlv1alpha1.Proxy) bool {
		return readyAndHealthy(p) && p.Status.IP != before.Status.IP
	})
	pods := proxyPods(t, ns)
	require.Len(t, pods, 1)
	assert.Equal(t, oldPod.Name, pods[0].Name, "same name")
	assert.NotEqual(t, oldPod.UID, pods[0].UID, "a new pod")
	assert.Equal(t, before.Status.InstanceName, after.Status.InstanceName)
	for _, reason := range []string{"Unhealthy", "UnhealthyTooLong", "Healthy"} {
		assert.True(t, hasEvent(t, ns, "sick", reason), "an Event %s tells the story", reason)
	}
}

func hasEvent(t *testing.T, ns, name, reason string) bool {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, world.cluster.Env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			return true
		}
	}
	return false
}

// e2eLocation is where the suite's geo database places every exit IP.
var e2eLocation = geoip.Location{Country: "DE", City: "Frankfurt am Main", ASN: 64500, ASNOrg: "E2E-LOOPBACK"}

func testExternal(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	sq := squid.Start(t, squid.Config{Address: "127.0.0.3", Port: 3128})
	hole, err := net.Listen("tcp", "127.0.0.4:3128")
	require.NoError(t, err)
	t.Cleanup(func() { _ = hole.Close() })
	go func() {
		for {
			conn, err := hole.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() }) // accepts, never answers
		}
	}()
	external := func(name, addr string) *crawlv1alpha1.Proxy {
		host, _, _ := net.SplitHostPort(addr)
		return &crawlv1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128,
				External:    &crawlv1alpha1.ExternalEndpoint{Address: host},
				HealthCheck: &crawlv1alpha1.HealthCheck{FailureThreshold: ptr(int32(1))}},
		}
	}
	good, bad := external("squid", sq.Addr), external("black-hole", hole.Addr().String())
	good.Spec.Attributes = map[string]string{"suite": ns, "country": "fr"} // the database says DE
	require.NoError(t, c.Create(ctx, good))
	require.NoError(t, c.Create(ctx, bad))

	waitProxy(t, client.ObjectKeyFromObject(good), "Healthy", readyAndHealthy)
	unhealthy := waitProxy(t, client.ObjectKeyFromObject(bad), "Unhealthy", func(p *crawlv1alpha1.Proxy) bool {
		return healthyStatus(p) == metav1.ConditionFalse
	})
	cond := meta.FindStatusCondition(unhealthy.Status.Conditions, crawlv1alpha1.ConditionHealthy)
	assert.Equal(t, "Timeout", cond.Reason)
	assert.Empty(t, proxyPods(t, ns), "External proxies are never provisioned")

	// Where the geo database places its exit IP: in status, as attributes
	// discovery selects by, and a Warning Event for the country it
	// declares against the database's word.
	located := waitProxy(t, client.ObjectKeyFromObject(good), "located", func(p *crawlv1alpha1.Proxy) bool { return p.Status.Geo != nil })
	assert.Equal(t, e2eLocation.Country, located.Status.Geo.Country)
	assert.Equal(t, int64(e2eLocation.ASN), located.Status.Geo.ASN)
	assert.Equal(t, "country fr is declared; the database places the exit IP in DE", located.Status.Geo.Mismatch)
	require.Eventually(t, func() bool { return hasEvent(t, ns, good.Name, "GeoMismatch") }, 10*time.Second, 100*time.Millisecond)
	var items []any
	require.Eventually(t, func() bool {
		list := api(t, "GET", "/v1/proxies?asn=64500&asnOrg=E2E-LOOPBACK&city=Frankfurt%20am%20Main&country=fr&healthy=true&suite="+ns, "")
		require.Equal(t, http.StatusOK, list.status)
		items = list.body["proxies"].([]any)
		return len(items) == 1
	}, 10*time.Second, 100*time.Millisecond, "selected by the database's asn and city, and the country it declares (discovery follows the status)")
	assert.Equal(t, ns+"/squid", items[0].(map[string]any)["id"])
}

func testRestart(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	proxy := managed(ns, "survivor")
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)
	before := waitProxy(t, key, "Ready and Healthy", readyAndHealthy)
	pod := proxyPods(t, ns)[0]
	lease := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q}}`, ns))
	require.Equal(t, http.StatusCreated, lease.status)

	world.operator.Kill()
	var err error
	world.operator, err = world.cluster.StartOperator(world.bin, world.opts)
	require.NoError(t, err)

	assert.Equal(t, http.StatusNotFound, api(t, "GET", "/v1/leases/"+lease.body["leaseID"].(string), "").status,
		"leases live in memory: a restart drops them")
	fresh := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q}}`, ns))
	require.Equal(t, http.StatusCreated, fresh.status, "new leases work at once")
	time.Sleep(3 * time.Second) // a few reconcile and probe rounds
	after := get(t, key)
	assert.True(t, readyAndHealthy(after), "still Ready and Healthy")
	assert.Equal(t, before.Status.IP, after.Status.IP, "no replacement")
	pods := proxyPods(t, ns)
	require.Len(t, pods, 1)
	assert.Equal(t, pod.UID, pods[0].UID, "the same pod")
}

func testAuth(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", "").status, "no token")
	r := call(t, "GET", "/v1/proxies", "", "wrong")
	assert.Equal(t, http.StatusUnauthorized, r.status, "a wrong token")
	assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
	assert.Equal(t, http.StatusOK, call(t, "GET", "/healthz", "", "").status, "probes need no token")

	var secret corev1.Secret
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: cluster.OperatorNamespace, Name: "discovery-token"}, &secret))
	rotated := fmt.Sprintf("rotated-%d", time.Now().UnixNano()) // fresh on every run, -count>1 included
	secret.Data["token"] = []byte(rotated)
	require.NoError(t, c.Update(ctx, &secret))
	require.Eventually(t, func() bool {
		return call(t, "GET", "/v1/proxies", "", rotated).status == http.StatusOK
	}, 10*time.Second, poll, "the rotated token works without a restart")
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", world.token).status, "the old one no longer does")
	world.token = rotated

	// Deleting the Secret never opens the API: the operator makes a new
	// one with a random token (a rotation), and only that one works.
	require.NoError(t, c.Delete(ctx, &secret))
	var recreated corev1.Secret
	require.Eventually(t, func() bool {
		err := c.Get(ctx, client.ObjectKey{Namespace: cluster.OperatorNamespace, Name: "discovery-token"}, &recreated)
		return err == nil && recreated.UID != secret.UID && len(recreated.Data["token"]) > 0
	}, 10*time.Second, poll, "the operator recreates a deleted token Secret")
	generated := string(recreated.Data["token"])
	assert.NotEqual(t, rotated, generated, "with a new, random token")
	require.Eventually(t, func() bool {
		return call(t, "GET", "/v1/proxies", "", generated).status == http.StatusOK
	}, 10*time.Second, poll, "the generated token works")
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", rotated).status, "the deleted one does not")
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", "").status, "and no token still gets nothing")
	world.token = generated
}

func ptr[T any](v T) *T { return &v }
