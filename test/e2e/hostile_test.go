package e2e

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// hostileSiteIP is the address of the site team A crawls in the hostile
// tenant suite (port 443, as the proxies' Squid allows).
const hostileSiteIP = "127.0.92.1"

// testHostileTenant: two teams share a pool; team A crawls through the
// gateway throughout, while team B (a tenant like any other) and a
// stranger try every abuse path docs/security.md lists. After each,
// nothing happened to the others: no shared proxy banned or burned, no
// pool grown, B's byte quota held within a few buffers, no credential
// valid past its lease, the API server's token reviews bounded, and team
// A's crawl never failed. Last, the platform locks the API and the
// gateway, and both refuse team A's token too.
func testHostileTenant(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	admin := kubernetes.NewForConfigOrDie(world.cluster.Env.Config)
	fleet := namespace(t)

	shared, aOnly, control := newPool(fleet, "shared", 2), newPool(fleet, "a-only", 1), newPool(fleet, "control", 1)
	aOnly.Spec.Autoscaling = &crawlv1alpha1.PoolAutoscaling{MinReplicas: 1, MaxReplicas: 3, TargetLeasesPerMember: 1,
		ScaleDownDelay: &metav1.Duration{Duration: 5 * time.Second}}
	for _, p := range []*crawlv1alpha1.ProxyPool{shared, aOnly, control} {
		require.NoError(t, c.Create(ctx, p))
	}
	for _, p := range []*crawlv1alpha1.ProxyPool{shared, aOnly, control} {
		waitPool(t, p, poolLongWait, "settled", settledAt(*p.Spec.Replicas))
	}
	before := map[string]string{} // shared member -> its IP
	for _, m := range members(t, shared) {
		before[m.Name] = m.Status.IP
	}

	a, b := newTeam(t, admin), newTeam(t, admin)
	grant(t, admin, fleet, "shared", a)
	grant(t, admin, fleet, "a-only", a)
	bindRole(t, admin, fleet, "lease-shared", b)
	quota := int64(256 << 10)
	require.NoError(t, c.Create(ctx, &crawlv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: b.sa.Namespace, Name: b.sa.Name},
		Spec: crawlv1alpha1.TenantQuotaSpec{GatewayBytesPerDay: resource.NewQuantity(quota, resource.BinarySI)}}))

	site := startBigSite(t, hostileSiteIP)
	crawl := startCrawl(t, a, site+"/ok")
	require.Eventually(t, func() bool { ok, _ := crawl.counts(); return ok >= 3 }, 60*time.Second, poll, "team A crawls through the gateway")

	t.Run("Squid's own refusals and one team's reports ban no shared proxy", func(t *testing.T) {
		for i := range 4 {
			status, header := rawGatewayConnect(t, fmt.Sprintf("x%d.example:8443", i), "b1", b.token)
			assert.Equal(t, http.StatusForbidden, status, "a port no proxy carries is refused before a pick")
			assert.Contains(t, header.Get("Proxy-Status"), "destination_denied")
		}
		for _, l := range leaseEachAs(t, b.token, "shared", 2) {
			for i := range 4 {
				r := call(t, "POST", "/v1/leases/"+l+"/report", fmt.Sprintf(`{"result":"blocked","target":"made-up-%d.example"}`, i), b.token)
				require.Equal(t, http.StatusNoContent, r.status, "%v", r.body)
			}
			call(t, "DELETE", "/v1/leases/"+l, "", b.token)
		}
		// The judge's positive control: the platform's word on the
		// control pool's member bans it, so a pass ran after B's reports.
		ctl := api(t, "POST", "/v1/leases", `{"selector":{"pool":"control"},"ttlSeconds":300}`)
		require.Equal(t, http.StatusCreated, ctl.status, "%v", ctl.body)
		reportBlocked(t, ctl.body["leaseID"].(string), "a.example", "b.example", "c.example")
		api(t, "DELETE", "/v1/leases/"+ctl.body["leaseID"].(string), "")
		ctlMember := leaseProxy(ctl)[len(fleet)+1:]
		require.Eventually(t, func() bool { return hasEvent(t, fleet, ctlMember, bans.EventBanned) }, waitFor, poll, "the control member is banned: the judge ran")
		assertSharedUntouched(t, shared, before)
	})

	t.Run("another team's refusals grow no pool", func(t *testing.T) {
		for range 20 {
			r := call(t, "POST", "/v1/leases", `{"selector":{"pool":"a-only"}}`, b.token)
			require.Equal(t, http.StatusServiceUnavailable, r.status, "a-only is not team B's")
		}
		l := call(t, "POST", "/v1/leases", `{"selector":{"pool":"a-only"},"ttlSeconds":120}`, a.token)
		require.Equal(t, http.StatusCreated, l.status, "%v", l.body)
		// An autoscale pass that saw A's lease came after B's refusals.
		p := waitPool(t, aOnly, waitFor, "the autoscaler saw team A's lease", func(p *crawlv1alpha1.ProxyPool, _ []crawlv1alpha1.Proxy) bool {
			return p.Status.Autoscaling != nil && p.Status.Autoscaling.ActiveLeases == 1
		})
		assert.Equal(t, int32(1), *p.Spec.Replicas, "one lease at one per member: B's refusals added nobody")
		call(t, "DELETE", "/v1/leases/"+l.body["leaseID"].(string), "", a.token)
	})

	t.Run("a byte quota holds inside a tunnel", func(t *testing.T) {
		var got int64
		// The TenantQuota reaches the operator's cache a moment after it is
		// made; until then a download is not metered, and goes through.
		require.Eventually(t, func() bool {
			n, err := fetchThrough(t, "b-big.pool-shared", b.token, site+"/big/"+strconv.Itoa(4<<20))
			got = n
			return err != nil
		}, 30*time.Second, time.Second, "team B's long download is cut")
		assert.Less(t, got, quota+4*32<<10, "at most the day's bytes and a few buffers")
		t.Logf("team B read %d bytes of its %d-byte quota before the cut", got, quota)
		_, err := fetchThrough(t, "b-next.pool-shared", b.token, site+"/ok")
		require.Error(t, err, "its next tunnel is refused")
		assert.Contains(t, err.Error(), "Too Many Requests")
	})

	t.Run("strangers drive a bounded number of token reviews", func(t *testing.T) {
		// The stranger calls from an address of its own: reviews are
		// bounded per client address, and the teams' crawl comes from
		// 127.0.0.1.
		const strangerIP = "127.0.93.1"
		stranger := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(strangerIP)}}).DialContext}}
		reviews := func() float64 { return apiServerRequests(t, admin, "tokenreviews") }
		start, t0 := reviews(), time.Now()
		exp := time.Now().Add(time.Hour).Unix()
		for i := range 300 {
			random := make([]byte, 24)
			_, _ = rand.Read(random)
			status, _ := rawGatewayConnectFrom(t, strangerIP, hostileSiteIP+":443", "s", base64.RawURLEncoding.EncodeToString(random))
			require.Equal(t, http.StatusProxyAuthRequired, status)
			forged := forgedToken(t, exp, i)
			status, _ = rawGatewayConnectFrom(t, strangerIP, hostileSiteIP+":443", "s", forged)
			require.Contains(t, []int{http.StatusProxyAuthRequired, http.StatusServiceUnavailable}, status, "a forged token: refused, or told to retry")
			if i%3 == 0 {
				r := callAs(t, stranger, "GET", "/v1/proxies", forgedToken(t, exp, 1000+i))
				require.Contains(t, []int{http.StatusUnauthorized, http.StatusServiceUnavailable}, r.status)
			}
		}
		elapsed := time.Since(t0).Seconds()
		made := reviews() - start
		// The stranger's share, and the two teams' own tokens reviewed
		// once per --tenant-review-ttl (1s here).
		bound := float64(kubeauth.DefaultReviewBurst) + kubeauth.DefaultReviewsPerSecond*elapsed + 2*(elapsed+2)
		assert.LessOrEqual(t, made, bound, "600 strangers' passwords and 100 API calls in %.1fs", elapsed)
		t.Logf("strangers sent 700 passwords and tokens in %.1fs; the API server made %.0f token reviews (bound %.0f)", elapsed, made, bound)
	})

	t.Run("a session key without its id is refused", func(t *testing.T) {
		status, header := rawGatewayConnect(t, hostileSiteIP+":443", "session--sesstime-10", b.token)
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Contains(t, header.Get("Proxy-Status"), "bad_username")
	})

	t.Run("no credential outlives its lease", func(t *testing.T) {
		m := members(t, shared)[0]
		pod := podOf(t, fleet, m.Name)
		raw, err := json.Marshal(pod)
		require.NoError(t, err)
		var secret corev1.Secret
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: fleet, Name: pod.Name}, &secret))
		key := strings.TrimSpace(string(secret.Data["lease.key"]))
		require.Len(t, key, 64)
		assert.NotContains(t, string(raw), key, "the pod object (the view role reads it) holds no key")
		addr := net.JoinHostPort(m.Status.IP, strconv.Itoa(int(m.Status.Port)))
		assert.Equal(t, http.StatusOK, connectWith(t, addr, mint(t, key, time.Now().Add(time.Minute))), "a key read from the Secret signs a short credential")
		assert.Equal(t, http.StatusProxyAuthRequired, connectWith(t, addr, mint(t, key, time.Now().Add(24*time.Hour))), "but none that outlives the longest lease")

		l := call(t, "POST", "/v1/leases", `{"selector":{"pool":"shared"},"ttlSeconds":120}`, a.token)
		require.Equal(t, http.StatusCreated, l.status)
		proxyURL, err := url.Parse(l.body["proxy"].(map[string]any)["url"].(string))
		require.NoError(t, err)
		leased, leasedAddr := proxyURL.User, proxyURL.Host
		assert.Equal(t, http.StatusOK, connectWith(t, leasedAddr, leased))
		require.Equal(t, http.StatusNoContent, call(t, "DELETE", "/v1/leases/"+l.body["leaseID"].(string), "", a.token).status)
		require.Eventually(t, func() bool { return connectWith(t, leasedAddr, leased) == http.StatusProxyAuthRequired },
			15*time.Second, 250*time.Millisecond, "a released lease's credentials are refused within seconds")
	})

	ok, failed := crawl.stop()
	assert.Zero(t, failed, "team A's crawl was never disturbed: %v", crawl.errs())
	t.Logf("team A crawled %d pages through the attacks, %d failed", ok, failed)
	assertSharedUntouched(t, shared, before)

	t.Run("locked means locked: the API and the gateway refuse every team", func(t *testing.T) {
		var secret corev1.Secret
		key := client.ObjectKey{Namespace: cluster.OperatorNamespace, Name: "discovery-token"}
		require.NoError(t, c.Get(ctx, key, &secret))
		token := secret.Data["token"]
		secret.Data["token"] = []byte{}
		require.NoError(t, c.Update(ctx, &secret))
		t.Cleanup(func() {
			var s corev1.Secret
			require.NoError(t, c.Get(ctx, key, &s))
			s.Data = map[string][]byte{"token": token}
			require.NoError(t, c.Update(ctx, &s))
			require.Eventually(t, func() bool { return call(t, "GET", "/v1/proxies", "", string(token)).status == http.StatusOK }, waitFor, poll)
		})
		var locked apiResponse
		require.Eventually(t, func() bool {
			locked = call(t, "GET", "/v1/proxies", "", a.token)
			return locked.status == http.StatusServiceUnavailable
		}, waitFor, poll, "the API locks")
		assert.Equal(t, "locked", errorCodeOf(locked))
		assert.Equal(t, "60", locked.header.Get("Retry-After"))
		status, header := rawGatewayConnect(t, hostileSiteIP+":443", "s1", a.token)
		assert.Equal(t, http.StatusServiceUnavailable, status, "the gateway refuses team A's token too")
		assert.Equal(t, "60", header.Get("Retry-After"))
	})
}

// assertSharedUntouched: every member of the shared pool is the one it was,
// on the IP it had, and none is banned.
func assertSharedUntouched(t *testing.T, pool *crawlv1alpha1.ProxyPool, before map[string]string) {
	t.Helper()
	now := members(t, pool)
	require.Len(t, now, len(before))
	for _, m := range now {
		ip, ok := before[m.Name]
		assert.True(t, ok, "member %s is new: one was replaced", m.Name)
		assert.Equal(t, ip, m.Status.IP, "member %s moved", m.Name)
		assert.False(t, meta.IsStatusConditionTrue(m.Status.Conditions, crawlv1alpha1.ConditionBanned), "member %s is banned", m.Name)
		assert.False(t, hasEvent(t, pool.Namespace, m.Name, bans.EventBanned), "member %s was banned", m.Name)
	}
}

// bindRole binds an existing Role in fleet to a team.
func bindRole(t *testing.T, admin kubernetes.Interface, fleet, role string, to team) {
	t.Helper()
	_, err := admin.RbacV1().RoleBindings(fleet).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: fleet, Name: role + "-" + to.sa.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: to.sa.Namespace, Name: to.sa.Name}}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// leaseEachAs leases n members of pool with token, one lease each (RBAC
// reaches the API server's authorizer a moment after a binding).
func leaseEachAs(t *testing.T, token, pool string, n int) []string {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		r := call(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"pool":%q},"ttlSeconds":300}`, pool), token)
		if r.status == http.StatusCreated && !seen[leaseProxy(r)] {
			seen[leaseProxy(r)] = true
			ids = append(ids, r.body["leaseID"].(string))
		}
		return len(ids) == n
	}, 30*time.Second, poll)
	return ids
}

// startBigSite serves https://ip:443: /ok a short page, /big/<n> n bytes.
func startBigSite(t *testing.T, ip string) string {
	t.Helper()
	cert, err := simweb.SelfSigned(net.ParseIP(ip), "hostile-suite site")
	require.NoError(t, err)
	lis, err := net.Listen("tcp", ip+":443")
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/big/")); err == nil {
			w.Header().Set("Content-Length", strconv.Itoa(n))
			chunk := make([]byte, 32<<10)
			for sent := 0; sent < n; sent += len(chunk) {
				if _, err := w.Write(chunk[:min(len(chunk), n-sent)]); err != nil {
					return
				}
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Listener = lis
	// Tunnels the suite opens and closes unused end their handshakes.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return "https://" + ip
}

// gatewayClient is a client of the gateway as username with password.
func gatewayClient(username, password string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(username, password), Host: world.gateway}),
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the suite's own site
		DisableKeepAlives: true,
	}}
}

// fetchThrough reads target through the gateway and returns the body's
// bytes read, and the error that ended the read, if any.
func fetchThrough(t *testing.T, username, password, target string) (int64, error) {
	t.Helper()
	resp, err := gatewayClient(username, password).Get(target)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode >= 300 {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return n, err
}

// crawler is a team crawling a page through the gateway every 250ms.
type crawler struct {
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	ok, fail int
	failures []string
}

func startCrawl(t *testing.T, who team, page string) *crawler {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &crawler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		cl := gatewayClient("crawl-a.pool-shared", who.token)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			resp, err := cl.Get(page)
			c.mu.Lock()
			switch {
			case err != nil:
				c.fail++
				c.failures = append(c.failures, err.Error())
			case resp.StatusCode != http.StatusOK:
				c.fail++
				c.failures = append(c.failures, resp.Status+" "+resp.Header.Get("Proxy-Status"))
			default:
				c.ok++
			}
			c.mu.Unlock()
			if resp != nil {
				_ = resp.Body.Close()
			}
		}
	}()
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *crawler) counts() (ok, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok, c.fail
}

func (c *crawler) errs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures
}

// stop ends the crawl and returns its counts.
func (c *crawler) stop() (ok, failed int) {
	c.cancel()
	<-c.done
	return c.counts()
}

// rawGatewayConnect sends the gateway a CONNECT to target as username with
// password, and returns its answer's status and headers.
func rawGatewayConnect(t *testing.T, target, username, password string) (int, http.Header) {
	t.Helper()
	return rawGatewayConnectFrom(t, "", target, username, password)
}

// rawGatewayConnectFrom is rawGatewayConnect from the local address from
// ("" any).
func rawGatewayConnectFrom(t *testing.T, from, target, username, password string) (int, http.Header) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", world.gateway)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	auth := base64.StdEncoding.EncodeToString([]byte(username + ":" + password))
	_, err = fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// connectWith sends a proxy at addr a CONNECT to the suite's site with
// user's credentials, and returns the status.
func connectWith(t *testing.T, addr string, user *url.Userinfo) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	password, _ := user.Password()
	auth := base64.StdEncoding.EncodeToString([]byte(user.Username() + ":" + password))
	target := hostileSiteIP + ":443"
	_, err = fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// mint signs credentials with a proxy's key (hex) as whoever read it
// would: "<subject>~<notAfter>", the key's HMAC-SHA256 in unpadded
// base64url (credentials.SignedFor's format).
func mint(t *testing.T, hexKey string, notAfter time.Time) *url.Userinfo {
	t.Helper()
	key, err := hex.DecodeString(hexKey)
	require.NoError(t, err)
	user := "minted~" + strconv.FormatInt(notAfter.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(user))
	require.Less(t, time.Until(notAfter), 48*time.Hour, "a test of %s", credentials.MaxLifetime)
	return url.UserPassword(user, base64.RawURLEncoding.EncodeToString(mac.Sum(nil)))
}

// forgedToken is shaped as a ServiceAccount token for the operator's
// audience, unexpired, signed by nobody.
func forgedToken(t *testing.T, exp int64, i int) string {
	t.Helper()
	enc := func(v any) string {
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		return base64.RawURLEncoding.EncodeToString(raw)
	}
	return enc(map[string]string{"alg": "RS256"}) + "." +
		enc(map[string]any{"aud": []string{"egress-proxies-operator"}, "exp": exp, "sub": fmt.Sprint("forged-", i)}) + ".c2lnbmF0dXJl"
}

// apiServerRequests is the API server's count of requests for resource
// (apiserver_request_total, every verb and code).
func apiServerRequests(t *testing.T, admin kubernetes.Interface, resource string) float64 {
	t.Helper()
	raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	require.NoError(t, err)
	total := 0.0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="`+resource+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		total += v
	}
	return total
}

// podOf is the pod of proxy in ns.
func podOf(t *testing.T, ns, proxy string) corev1.Pod {
	t.Helper()
	for _, pod := range proxyPods(t, ns) {
		if pod.Labels[crawlv1alpha1.LabelOwnerName] == proxy {
			return pod
		}
	}
	t.Fatalf("no pod for %s/%s", ns, proxy)
	return corev1.Pod{}
}

// callAs calls the discovery API with cl and a bearer token.
func callAs(t *testing.T, cl *http.Client, method, path, token string) apiResponse {
	t.Helper()
	req, err := http.NewRequest(method, world.discovery+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := cl.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return apiResponse{status: res.StatusCode, header: res.Header}
}
