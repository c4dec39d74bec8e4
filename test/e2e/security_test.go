package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/squid"
)

// passwords are every proxy password the run has seen, for the leak check.
var passwords = struct {
	sync.Mutex
	set map[string]bool
}{set: map[string]bool{}}

func notePassword(pw string) {
	passwords.Lock()
	defer passwords.Unlock()
	if pw != "" {
		passwords.set[pw] = true
	}
}

// connectStatus sends a CONNECT for target through the proxy at addr, with
// Basic credentials when user is set, and returns the proxy's status code.
func connectStatus(t *testing.T, addr, target, user, password string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	if user != "" {
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+password)))
	}
	require.NoError(t, req.Write(conn))
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	require.NoError(t, err)
	_ = res.Body.Close()
	return res.StatusCode
}

// probeTarget is the host:port of the run's probe target, the one place a
// proxy may tunnel to here.
func probeTarget(t *testing.T) string {
	u, err := url.Parse(world.cluster.Target.URL)
	require.NoError(t, err)
	return u.Host
}

type leasedProxy struct{ id, addr, user, password, url string }

// leaseOne leases a proxy of the suite ns for ttl seconds; the caller
// releases it (release) when it is done with its credentials.
func leaseOne(t *testing.T, ns string, ttl int) leasedProxy {
	t.Helper()
	// Discovery's informer may see the Proxy Ready a moment after the
	// test's own read of it did.
	var lease apiResponse
	require.Eventually(t, func() bool {
		lease = api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q},"ttlSeconds":%d}`, ns, ttl))
		return lease.status != http.StatusServiceUnavailable
	}, 10*time.Second, poll)
	require.Equal(t, http.StatusCreated, lease.status, "lease: %v", lease.body)
	p := lease.body["proxy"].(map[string]any)
	out := leasedProxy{id: lease.body["leaseID"].(string), addr: net.JoinHostPort(p["ip"].(string), fmt.Sprint(p["port"])), url: p["url"].(string)}
	out.user, _ = p["username"].(string)
	out.password, _ = p["password"].(string)
	notePassword(out.password)
	return out
}

func (l leasedProxy) release(t *testing.T) {
	t.Helper()
	require.Equal(t, http.StatusNoContent, api(t, "DELETE", "/v1/leases/"+l.id, "").status)
}

func testSecurity(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	target := probeTarget(t)

	t.Run("a Managed proxy takes only its leases' credentials, until released or expired", func(t *testing.T) {
		ns := namespace(t)
		var addrs []string
		for _, name := range []string{"closed-a", "closed-b"} {
			proxy := managed(ns, name)
			require.NoError(t, c.Create(ctx, proxy))
			p := waitProxy(t, client.ObjectKeyFromObject(proxy), "Ready and Healthy", readyAndHealthy)
			addrs = append(addrs, net.JoinHostPort(p.Status.IP, fmt.Sprint(p.Status.Port)))
		}
		leased := leaseOne(t, ns, 300)
		require.NotEmpty(t, leased.password, "an authenticated API hands out the lease's credentials")
		assert.Equal(t, fmt.Sprintf("http://%s:%s@%s", leased.user, leased.password, leased.addr), leased.url)
		other := addrs[0]
		if other == leased.addr {
			other = addrs[1]
		}
		assert.Equal(t, http.StatusProxyAuthRequired, connectStatus(t, leased.addr, target, "", ""), "no credentials")
		assert.Equal(t, http.StatusProxyAuthRequired, connectStatus(t, leased.addr, target, leased.user, leased.password+"x"), "a wrong password")
		assert.Equal(t, http.StatusOK, connectStatus(t, leased.addr, target, leased.user, leased.password), "the lease's credentials tunnel")
		assert.Equal(t, http.StatusProxyAuthRequired, connectStatus(t, other, target, leased.user, leased.password), "on their proxy only")
		var generated corev1.Secret
		require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: cluster.OperatorNamespace, Name: "proxy-credentials-" + cluster.ProviderName}, &generated))
		assert.Equal(t, http.StatusProxyAuthRequired, connectStatus(t, leased.addr, target, string(generated.Data["username"]), string(generated.Data["password"])),
			"the provider's password itself opens no proxy")

		leased.release(t)
		require.Eventually(t, func() bool {
			return connectStatus(t, leased.addr, target, leased.user, leased.password) == http.StatusProxyAuthRequired
		}, 15*time.Second, 250*time.Millisecond, "a released lease's credentials are refused (the operator revokes them through the proxy)")

		short := leaseOne(t, ns, 2)
		assert.Equal(t, http.StatusOK, connectStatus(t, short.addr, target, short.user, short.password))
		require.Eventually(t, func() bool {
			return connectStatus(t, short.addr, target, short.user, short.password) == http.StatusProxyAuthRequired
		}, 15*time.Second, 250*time.Millisecond, "an expired lease's credentials are refused")
	})

	t.Run("a rotated Secret replaces the instance and the old credentials stop working", func(t *testing.T) {
		ns := namespace(t)
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler-creds", Labels: map[string]string{crawlv1alpha1.LabelCredentials: "true"}},
			Type:       corev1.SecretTypeBasicAuth,
			Data:       map[string][]byte{"username": []byte("team-a"), "password": []byte("first-password-0123456789")},
		}
		notePassword("first-password-0123456789")
		notePassword("second-password-0123456789")
		require.NoError(t, c.Create(ctx, secret))
		proxy := managed(ns, "rotated")
		proxy.Spec.Credentials = &crawlv1alpha1.CredentialsSource{SecretRef: crawlv1alpha1.LocalSecretReference{Name: secret.Name}}
		require.NoError(t, c.Create(ctx, proxy))
		before := waitProxy(t, client.ObjectKeyFromObject(proxy), "Ready and Healthy", readyAndHealthy)
		first := leaseOne(t, ns, 600)
		assert.Equal(t, http.StatusOK, connectStatus(t, first.addr, target, first.user, first.password))

		secret.Data["password"] = []byte("second-password-0123456789")
		require.NoError(t, c.Update(ctx, secret))
		after := waitProxy(t, client.ObjectKeyFromObject(proxy), "replaced, Ready and Healthy", func(p *crawlv1alpha1.Proxy) bool {
			return p.Status.SpecHash != before.Status.SpecHash && p.Status.IP != before.Status.IP && readyAndHealthy(p)
		})
		second := leaseOne(t, ns, 60)
		defer second.release(t)
		addr := net.JoinHostPort(after.Status.IP, fmt.Sprint(after.Status.Port))
		assert.Equal(t, addr, second.addr)
		assert.Equal(t, http.StatusOK, connectStatus(t, addr, target, second.user, second.password), "a new lease's credentials work on the new instance")
		assert.Equal(t, http.StatusProxyAuthRequired, connectStatus(t, addr, target, first.user, first.password), "credentials signed with the old key do not")
	})

	t.Run("an open Squid is found OpenProxy and never leased", func(t *testing.T) {
		ns := namespace(t)
		open := squid.Start(t, squid.Config{Address: "127.0.0.6", Port: 3128}) // CONNECT from localhost, no credentials
		proxy := &crawlv1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "open", Labels: map[string]string{}},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128,
				Attributes:  map[string]string{"suite": ns},
				External:    &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.6", OpenProxyCheck: true},
				HealthCheck: &crawlv1alpha1.HealthCheck{FailureThreshold: ptr(int32(2))}},
		}
		require.NoError(t, c.Create(ctx, proxy))
		start := time.Now()
		found := waitProxy(t, client.ObjectKeyFromObject(proxy), "Unhealthy", func(p *crawlv1alpha1.Proxy) bool {
			return healthyStatus(p) == metav1.ConditionFalse
		})
		cond := meta.FindStatusCondition(found.Status.Conditions, crawlv1alpha1.ConditionHealthy)
		assert.Equal(t, "OpenProxy", cond.Reason)
		t.Logf("found open after %s (%s)", time.Since(start).Round(time.Second), open.Addr)
		lease := api(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q}}`, ns))
		assert.Equal(t, http.StatusServiceUnavailable, lease.status, "an open proxy is never leased")
		require.Eventually(t, func() bool {
			var list eventsv1.EventList
			if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
				return false
			}
			for _, e := range list.Items {
				if e.Regarding.Name == "open" && e.Reason == "OpenProxy" && e.Type == corev1.EventTypeWarning {
					return true
				}
			}
			return false
		}, waitFor, poll, "a Warning Event says the proxy is open")
	})
}

// testNoPasswordLeaks greps every operator log line, every Event and every
// Proxy status written during the run for the passwords it has seen, and
// for those of every credentials Secret, and must find none.
func testNoPasswordLeaks(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	var secrets corev1.SecretList
	require.NoError(t, c.List(ctx, &secrets, client.HasLabels{crawlv1alpha1.LabelCredentials}))
	for i := range secrets.Items {
		notePassword(string(secrets.Items[i].Data["password"]))
	}
	passwords.Lock()
	defer passwords.Unlock()
	require.NotEmpty(t, passwords.set, "the run saw no password: nothing was checked")

	var haystacks []struct{ what, text string }
	logs, err := filepath.Glob(filepath.Join(world.cluster.Dir, "operator-*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	for _, path := range logs {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		haystacks = append(haystacks, struct{ what, text string }{path, string(data)})
	}
	var events eventsv1.EventList
	require.NoError(t, c.List(ctx, &events))
	require.NotEmpty(t, events.Items)
	for _, e := range events.Items {
		haystacks = append(haystacks, struct{ what, text string }{"event " + e.Name, e.Note + " " + e.Reason})
	}
	var proxies crawlv1alpha1.ProxyList
	require.NoError(t, c.List(ctx, &proxies))
	for i := range proxies.Items {
		status, err := json.Marshal(proxies.Items[i].Status)
		require.NoError(t, err)
		haystacks = append(haystacks, struct{ what, text string }{"status of " + proxies.Items[i].Name, string(status)})
	}
	for pw := range passwords.set {
		for _, h := range haystacks {
			assert.False(t, strings.Contains(h.text, pw), "a password appears in %s", h.what)
		}
	}
	t.Logf("checked %d passwords against %d log files, %d Events and %d statuses", len(passwords.set), len(logs), len(events.Items), len(proxies.Items))
}
