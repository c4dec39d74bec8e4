package discovery

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// recordStore answers lookups of instance records by Secret name.
type recordStore map[string]credentials.Credentials

func (s recordStore) Lookup(_ context.Context, ref credentials.Ref) (credentials.Credentials, error) {
	c, ok := s[ref.Namespace+"/"+ref.Name]
	if !ok {
		return credentials.Credentials{}, credentials.ErrNotFound
	}
	return c, nil
}

func credentialedFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.srv.opts.Credentials = recordStore{"operator-ns/" + credentials.RecordName("crawl", "h1"): {Username: "crawler", Password: "s3cret-password-0123"}}
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1"},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.9", Port: 3128,
			InstanceName: "px-crawl-eu-1", SpecHash: "h1"},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "x")
	f.view.upsert(p)
	return f
}

func TestCredentialsOnlyToAuthenticatedClients(t *testing.T) {
	t.Run("authenticated, an instance built before per-lease credentials: the shared password, until it is replaced", func(t *testing.T) {
		f := credentialedFixture(t)
		f.token.value = "tok"
		res := f.do("POST", "/v1/leases", `{}`, "Authorization", "Bearer tok")
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		p := res.body["proxy"].(map[string]any)
		assert.Equal(t, "http://crawler:s3cret-password-0123@127.0.0.9:3128", p["url"])
		assert.Equal(t, "crawler", p["username"])
		assert.Equal(t, "s3cret-password-0123", p["password"])
		assert.NotContains(t, p, "credentialsWithheld")

		list := f.do("GET", "/v1/proxies", "", "Authorization", "Bearer tok")
		require.Equal(t, http.StatusOK, list.status)
		assert.Equal(t, "s3cret-password-0123", list.body["proxies"].([]any)[0].(map[string]any)["password"])
	})
	t.Run("unauthenticated: no credentials, and why", func(t *testing.T) {
		f := credentialedFixture(t)
		for _, res := range []response{f.do("POST", "/v1/leases", `{}`), f.do("GET", "/v1/proxies", "")} {
			require.Less(t, res.status, 300, res.raw)
			assert.NotContains(t, res.raw, "s3cret-password-0123")
			assert.Contains(t, res.raw, "the discovery API runs unauthenticated (--discovery-auth=none), so it never hands out proxy credentials")
			assert.Contains(t, res.raw, `"url":"http://127.0.0.9:3128"`)
		}
	})
	t.Run("a record that cannot be read is withheld, not guessed", func(t *testing.T) {
		f := credentialedFixture(t)
		f.token.value = "tok"
		f.srv.opts.Credentials = recordStore{}
		res := f.do("GET", "/v1/proxies", "", "Authorization", "Bearer tok")
		assert.Contains(t, res.raw, withheldUnavailable)
		assert.NotContains(t, res.raw, `"password"`)
	})
}

// leaseSchemeFixture is credentialedFixture whose proxy was built to check
// per-lease credentials, with the API's token "tok"; shared is its record.
func leaseSchemeFixture(t *testing.T) (f *fixture, shared credentials.Credentials) {
	f = credentialedFixture(t)
	shared = credentials.Credentials{Username: "crawler", Password: "s3cret-password-0123", Scheme: credentials.SchemeLease}
	f.srv.opts.Credentials = recordStore{"operator-ns/" + credentials.RecordName("crawl", "h1"): shared}
	f.token.value = "tok"
	return f, shared
}

// TestPerLeaseCredentials: an instance built with the lease scheme gets
// credentials of each lease's own, signed for its proxy and expiring with
// the lease; a renewal re-signs them with the new expiry; a listing hands
// none out; the gateway's tunnels sign their own.
func TestPerLeaseCredentials(t *testing.T) {
	f, shared := leaseSchemeFixture(t)
	auth := []string{"Authorization", "Bearer tok"}

	res := f.do("POST", "/v1/leases", `{"ttlSeconds":60}`, auth...)
	require.Equal(t, http.StatusCreated, res.status, res.raw)
	id := res.body["leaseID"].(string)
	expires, err := time.Parse(time.RFC3339, res.body["expiresAt"].(string))
	require.NoError(t, err)
	want, err := shared.SignedFor("crawl/eu-1", id, expires)
	require.NoError(t, err)
	p := res.body["proxy"].(map[string]any)
	assert.Equal(t, want.Username, p["username"], "the lease id and its expiry")
	assert.Equal(t, want.Password, p["password"])
	assert.NotContains(t, res.raw, shared.Password, "never the provider's password")

	f.clock.Step(30 * time.Second)
	renewed := f.do("POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds":60}`, auth...)
	require.Equal(t, http.StatusOK, renewed.status)
	rp := renewed.body["proxy"].(map[string]any)
	assert.NotEqual(t, p["username"], rp["username"], "renewing extends them: new credentials with the new expiry")
	assert.Contains(t, rp["username"], id+"~")

	list := f.do("GET", "/v1/proxies", "", auth...)
	item := list.body["proxies"].([]any)[0].(map[string]any)
	assert.Nil(t, item["password"])
	assert.Equal(t, withheldPerLease, item["credentialsWithheld"])

	up, err := f.srv.Tunnels().Pick(context.Background(), TunnelRequest{Tenant: tenant.Platform, Host: "shop.example", TTL: time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	pw, _ := up.User.Password()
	assert.True(t, strings.HasPrefix(up.User.Username(), up.LeaseID+"~"), "the gateway signs its own lease's credentials")
	assert.NotEqual(t, shared.Password, pw)
}

// TestReleaseRevokesThroughTheProxy: releasing a lease on a proxy that
// takes per-lease credentials sends that proxy a CONNECT whose credentials,
// signed with its key, name the lease; the proxy's 407 is the answer.
func TestReleaseRevokesThroughTheProxy(t *testing.T) {
	f, shared := leaseSchemeFixture(t)
	auth := []string{"Authorization", "Bearer tok"}
	seen := make(chan string, 4)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.Header.Get("Proxy-Authorization")
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	defer proxy.Close()
	f.srv.revoker.dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, proxy.Listener.Addr().String())
	}

	res := f.do("POST", "/v1/leases", `{"ttlSeconds":60}`, auth...)
	require.Equal(t, http.StatusCreated, res.status)
	id := res.body["leaseID"].(string)
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+id, "", auth...).status)
	f.srv.revoker.flush(context.Background())
	got := <-seen
	method, header, _ := strings.Cut(got, " ")
	assert.Equal(t, http.MethodConnect, method)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(header, "Basic "))
	require.NoError(t, err)
	user, pass, _ := strings.Cut(string(raw), ":")
	want, err := shared.Revocation("crawl/eu-1", []string{id}, time.Unix(mustUnix(t, user), 0))
	require.NoError(t, err)
	assert.Equal(t, want.Username, user, "revoke~<until>~<lease id>")
	assert.Equal(t, want.Password, pass, "signed with the proxy's key")
	assert.Equal(t, 1.0, testutil.ToFloat64(revocationsTotal.WithLabelValues("sent")))
}

// mustUnix is the notAfter of a revocation's username.
func mustUnix(t *testing.T, user string) int64 {
	parts := strings.Split(user, "~")
	require.Len(t, parts, 3, user)
	n, err := strconv.ParseInt(parts[1], 10, 64)
	require.NoError(t, err)
	return n
}

// TestRevocationsDoNotStallBehindDeadProxies: with 40 proxies in the queue
// that take a connection and never answer (each holds its send for the
// whole revokeTimeout), a live proxy's revocation still goes out in the
// same flush, well within one timeout per batch of revokeParallel; a
// revocation past its lease's expiry is dropped, not retried; a proxy that
// left the fleet has its revocations dropped.
func TestRevocationsDoNotStallBehindDeadProxies(t *testing.T) {
	f, shared := leaseSchemeFixture(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	seen := make(chan string, 4)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Proxy-Authorization")
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	defer live.Close()

	now := f.clock.Now()
	for i := range 40 {
		id := fmt.Sprintf("crawl/dead-%d", i)
		f.proxy(fmt.Sprintf("dead-%d", i), fmt.Sprintf("127.0.1.%d", i), true, nil)
		f.srv.revoker.add(id, silent.Addr().String(), shared, fmt.Sprintf("lease-dead-%d", i), now.Add(time.Hour))
	}
	f.srv.revoker.add("crawl/eu-1", live.Listener.Addr().String(), shared, "lease-live", now.Add(time.Hour))
	f.srv.revoker.add("crawl/eu-1", live.Listener.Addr().String(), shared, "lease-expired", now.Add(-time.Second))
	f.srv.revoker.add("crawl/gone", silent.Addr().String(), shared, "lease-gone", now.Add(time.Hour))

	start := time.Now()
	f.srv.revoker.flush(context.Background())
	took := time.Since(start)
	t.Logf("the flush took %s", took)
	select {
	case header := <-seen:
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(header, "Basic "))
		require.NoError(t, err)
		assert.Contains(t, string(raw), "lease-live")
		assert.NotContains(t, string(raw), "lease-expired", "an expired lease's credentials are refused anyway")
	default:
		t.Fatal("the live proxy was not told in the flush")
	}
	assert.Less(t, took, 3*revokeTimeout, "40 silent proxies cost about two timeouts in parallel, not 40 in a row")
	assert.Equal(t, 40, f.srv.revoker.queued(), "the silent proxies' revocations wait for the next flush; the gone proxy's and the expired one are dropped")

	f.clock.Step(2 * time.Hour)
	f.srv.revoker.flush(context.Background())
	assert.Equal(t, 0, f.srv.revoker.queued(), "once their leases expired, nothing is retried")
}
