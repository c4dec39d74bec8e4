package discovery

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/tenant"
)

// fakeTenants knows two ServiceAccount tokens and grants each one pool.
type fakeTenants struct {
	byToken map[string]*tenant.Tenant
	pools   map[string]string // tenant name -> the pool it may lease
}

func (f *fakeTenants) Identify(_ context.Context, token string) (*tenant.Tenant, error) {
	return f.byToken[token], nil
}

func (f *fakeTenants) MayLease(_ context.Context, t *tenant.Tenant, p tenant.Proxy) (bool, error) {
	return t.All() || (p.Pool != "" && f.pools[t.Name] == p.Pool), nil
}

func twoTeams() *fakeTenants {
	a := tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:team-a:crawler"})
	b := tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:team-b:crawler"})
	return &fakeTenants{byToken: map[string]*tenant.Tenant{"token-a": a, "token-b": b},
		pools: map[string]string{a.Name: "eu", b.Name: "us"}}
}

// member adds a healthy member of pool to the view.
func (f *fixture) member(pool, name, ip string) {
	p := f.proxy(name, ip, true, nil)
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: pool, UID: types.UID("u-" + pool), Controller: ptrTo(true)}}
	f.view.upsert(p)
}

// TestTenantsLeaseOnlyTheirPools: a ServiceAccount tenant lists and leases
// only the proxies RBAC grants it, sees and acts on its own leases only
// (another's is not found, and its release ends nothing), and its gateway
// sessions are its own; the discovery token still reaches everything; an
// unknown token is refused.
func TestTenantsLeaseOnlyTheirPools(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	f.srv.opts.Tenants = twoTeams()
	f.member("eu", "eu-0", "127.0.0.11")
	f.member("us", "us-0", "127.0.0.12")
	f.proxy("loner", "127.0.0.13", true, nil)
	as := func(token string) []string { return []string{"Authorization", "Bearer " + token} }

	list := f.do("GET", "/v1/proxies", "", as("token-a")...)
	require.Equal(t, http.StatusOK, list.status)
	require.Len(t, list.body["proxies"], 1, "team A sees its pool only")
	assert.Equal(t, "crawl/eu-0", list.body["proxies"].([]any)[0].(map[string]any)["id"])
	assert.Len(t, f.do("GET", "/v1/proxies", "", as("platform-token")...).body["proxies"], 3, "the discovery token sees the fleet")

	for range 3 {
		r := f.do("POST", "/v1/leases", `{}`, as("token-a")...)
		require.Equal(t, http.StatusCreated, r.status)
		assert.Equal(t, "crawl/eu-0", proxyID(r), "team A leases from its pool only")
	}
	refused := f.do("POST", "/v1/leases", `{"selector":{"pool":"us"}}`, as("token-a")...)
	assert.Equal(t, http.StatusServiceUnavailable, refused.status, "another team's pool is not there for team A")
	assert.Equal(t, CodeNoProxyAvailable, errorCode(refused))

	bLease := f.do("POST", "/v1/leases", `{}`, as("token-b")...)
	require.Equal(t, http.StatusCreated, bLease.status)
	id := bLease.body["leaseID"].(string)
	assert.Equal(t, http.StatusNotFound, f.do("GET", "/v1/leases/"+id, "", as("token-a")...).status, "another tenant's lease is not found")
	assert.Equal(t, http.StatusNotFound, f.do("POST", "/v1/leases/"+id+"/renew", "", as("token-a")...).status)
	assert.Equal(t, http.StatusNotFound, f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"x.com"}`, as("token-a")...).status)
	assert.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+id, "", as("token-a")...).status)
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/leases/"+id, "", as("token-b")...).status, "and releasing it ended nothing")
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/leases/"+id, "", as("platform-token")...).status, "the platform sees every lease")
	assert.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+id, "", as("token-b")...).status)
	assert.Equal(t, http.StatusNotFound, f.do("GET", "/v1/leases/"+id, "", as("token-b")...).status, "its holder released it")

	assert.Equal(t, http.StatusUnauthorized, f.do("GET", "/v1/proxies", "", as("token-c")...).status, "a token nobody knows")

	// Gateway tunnels: each tenant's go through its pool, and two tenants'
	// sessions of one name are two sessions.
	tunnels := f.srv.Tunnels()
	a, err := tunnels.Authorize(context.Background(), "token-a")
	require.NoError(t, err)
	b, err := tunnels.Authorize(context.Background(), "token-b")
	require.NoError(t, err)
	_, err = tunnels.Authorize(context.Background(), "token-c")
	require.ErrorIs(t, err, ErrWrongToken)
	for _, tc := range []struct {
		who  *tenant.Tenant
		want string
	}{{a, "crawl/eu-0"}, {b, "crawl/us-0"}} {
		up, err := tunnels.Pick(context.Background(), TunnelRequest{Tenant: tc.who, Session: "s1", Host: "example.com", TTL: DefaultTTL, SessionIdle: DefaultTTL})
		require.NoError(t, err)
		assert.Equal(t, tc.want, up.ProxyID, "%s's session s1", tc.who.Name)
	}
	assert.Equal(t, "system:serviceaccount:team-a:crawler/s1", SessionKey(a, "s1"))
	assert.Equal(t, "s1", SessionKey(tenant.Platform, "s1"), "the platform's sessions keep their names")
}
