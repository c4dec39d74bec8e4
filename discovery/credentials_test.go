package discovery

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func credentialedFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.configure(func(o *Options) {
		o.Credentials = testenv.Records{"operator-ns/" + credentials.RecordName("crawl", "h1"): {Username: "crawler", Password: "s3cret-password-0123"}}
	})
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1"},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.9", Port: 3128,
			InstanceName: "px-crawl-eu-1", SpecHash: "h1"},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "x")
	f.view.Upsert(p)
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
		f.configure(func(o *Options) { o.Credentials = testenv.Records{} })
		res := f.do("GET", "/v1/proxies", "", "Authorization", "Bearer tok")
		assert.Contains(t, res.raw, broker.WithheldUnavailable)
		assert.NotContains(t, res.raw, `"password"`)
	})
}

// leaseSchemeFixture is credentialedFixture whose proxy was built to check
// per-lease credentials, with the API's token "tok"; shared is its record.
func leaseSchemeFixture(t *testing.T) (f *fixture, shared credentials.Credentials) {
	f = credentialedFixture(t)
	shared = credentials.Credentials{Username: "crawler", Password: "s3cret-password-0123", Scheme: credentials.SchemeLease}
	f.configure(func(o *Options) {
		o.Credentials = testenv.Records{"operator-ns/" + credentials.RecordName("crawl", "h1"): shared}
	})
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
	assert.Equal(t, broker.WithheldPerLease, item["credentialsWithheld"])

	up, err := f.srv.Tunnels().Tunnel(context.Background(), broker.TunnelRequest{Tenant: tenant.Platform, Host: "shop.example", TTL: time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	pw, _ := up.User.Password()
	assert.True(t, strings.HasPrefix(up.User.Username(), up.LeaseID+"~"), "the gateway signs its own lease's credentials")
	assert.NotEqual(t, shared.Password, pw)
}
