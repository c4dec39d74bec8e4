package discovery

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// fakeTenants knows two ServiceAccount tokens and grants each one pool.
type fakeTenants struct {
	byToken map[string]*tenant.Tenant
	pools   map[string]string // tenant name -> the pool it may lease
	readers map[string]bool   // tenants that may read the ledger
}

func (f *fakeTenants) Identify(_ context.Context, token string) (*tenant.Tenant, error) {
	return f.byToken[token], nil
}

func (f *fakeTenants) MayReadAttribution(_ context.Context, t *tenant.Tenant) (bool, error) {
	return t.All() || f.readers[t.Name], nil
}

func (f *fakeTenants) MayReadUsage(_ context.Context, t *tenant.Tenant) (bool, error) {
	return t.All() || f.readers[t.Name], nil
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
	f.view.Upsert(p)
}

// TestTenantsLeaseOnlyTheirPools: a ServiceAccount tenant lists and leases
// only the proxies RBAC grants it, sees and acts on its own leases only
// (another's is not found, and its release ends nothing), and its gateway
// sessions are its own; the discovery token still reaches everything; an
// unknown token is refused.
func TestTenantsLeaseOnlyTheirPools(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	f.configure(func(o *Options) { o.Tenants = twoTeams() })
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
	require.ErrorIs(t, err, broker.ErrWrongToken)
	for _, tc := range []struct {
		who  *tenant.Tenant
		want string
	}{{a, "crawl/eu-0"}, {b, "crawl/us-0"}} {
		up, err := tunnels.Tunnel(context.Background(), broker.TunnelRequest{Tenant: tc.who, Session: "s1", Host: "example.com", TTL: broker.DefaultTTL, SessionIdle: broker.DefaultTTL})
		require.NoError(t, err)
		assert.Equal(t, tc.want, up.ProxyID, "%s's session s1", tc.who.Name)
	}
	assert.Equal(t, "system:serviceaccount:team-a:crawler/s1", broker.SessionKey(a, "s1"))
	assert.Equal(t, "s1", broker.SessionKey(tenant.Platform, "s1"), "the platform's sessions keep their names")
}

// TestQuotasHoldAtTheirLimits: a tenant with a TenantQuota holds at most
// maxLeases leases and maxTunnels tunnels (429 quota_exceeded with
// Retry-After when the first ends), opens tunnels at tunnelsPerSecond,
// and none once the day's gateway bytes are spent (until midnight UTC);
// below each limit nothing is refused, and other tenants are not bound by
// it.
func TestQuotasHoldAtTheirLimits(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	teams := twoTeams()
	teams.pools["system:serviceaccount:team-b:crawler"] = "eu" // both teams share the pool here
	f.configure(func(o *Options) { o.Tenants = teams })
	quotas := broker.NewQuotaIndex()
	f.configure(func(o *Options) { o.Quotas = quotas })
	two, one := int32(2), int32(1)
	quotas.Handler().OnAdd(&crawlv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "crawler"},
		Spec: crawlv1alpha1.TenantQuotaSpec{MaxLeases: &two, MaxTunnels: &one, TunnelsPerSecond: &two, GatewayBytesPerDay: resource.NewQuantity(1000, resource.BinarySI)}}, false)
	for i := range 3 {
		f.member("eu", fmt.Sprintf("eu-%d", i), fmt.Sprintf("127.0.0.%d", 11+i))
	}
	as := func(token string) []string { return []string{"Authorization", "Bearer " + token} }

	var ids []string
	for range 2 {
		r := f.do("POST", "/v1/leases", `{"ttlSeconds":60}`, as("token-a")...)
		require.Equal(t, http.StatusCreated, r.status, "below the limit: %s", r.raw)
		ids = append(ids, r.body["leaseID"].(string))
		f.clock.Step(10 * time.Second)
	}
	over := f.do("POST", "/v1/leases", `{}`, as("token-a")...)
	assert.Equal(t, http.StatusTooManyRequests, over.status)
	assert.Equal(t, CodeQuotaExceeded, errorCode(over))
	assert.Equal(t, "40", over.header.Get("Retry-After"), "when the first lease ends")
	assert.Contains(t, errorMessage(over), "TenantQuota team-a/crawler")
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{}`, as("token-b")...).status, "another tenant is not bound by it")
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{}`, as("platform-token")...).status, "nor is the platform")
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+ids[0], "", as("token-a")...).status)
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{}`, as("token-a")...).status, "a released lease frees its place")

	ctx := context.Background()
	tunnels := f.srv.Tunnels()
	a, err := tunnels.Authorize(ctx, "token-a")
	require.NoError(t, err)
	pick := func() (broker.Upstream, error) {
		return tunnels.Tunnel(ctx, broker.TunnelRequest{Tenant: a, Host: "example.com", TTL: time.Minute, SessionIdle: time.Minute})
	}
	tunnel, err := pick()
	require.NoError(t, err, "one tunnel")
	var quota *broker.QuotaError
	_, err = pick()
	require.ErrorAs(t, err, &quota, "a second tunnel is over maxTunnels")
	assert.Equal(t, broker.LimitTunnels, quota.Limit)

	require.NoError(t, tunnels.Admit(ctx, a))
	require.NoError(t, tunnels.Admit(ctx, a), "a second's worth at once")
	require.ErrorAs(t, tunnels.Admit(ctx, a), &quota)
	assert.Equal(t, broker.LimitTunnelsPerSecond, quota.Limit)
	assert.InDelta(t, 0.5, quota.RetryAfter.Seconds(), 0.01)
	f.clock.Step(500 * time.Millisecond)
	require.NoError(t, tunnels.Admit(ctx, a), "the rate allows one more half a second later")

	f.clock.Step(time.Second)
	tunnels.ReleaseTunnel(ctx, tunnel.LeaseID, "", broker.Carried{Down: 999})
	assert.False(t, tunnels.CountBytes(ctx, a, 999), "what the tunnel carried, below the day's bytes")
	require.NoError(t, tunnels.Admit(ctx, a), "below the day's bytes")
	_, err = pick()
	require.NoError(t, err, "its release freed its place under maxTunnels")
	f.clock.Step(time.Second)
	assert.True(t, tunnels.CountBytes(ctx, a, 1), "the day's bytes are spent")
	b, err := tunnels.Authorize(ctx, "token-b")
	require.NoError(t, err)
	assert.False(t, tunnels.CountBytes(ctx, b, 1<<20), "another tenant is not bound by it")
	require.ErrorAs(t, tunnels.Admit(ctx, a), &quota, "the day's bytes are spent")
	assert.Equal(t, broker.LimitBytesPerDay, quota.Limit)
	now := f.clock.Now()
	assert.Equal(t, time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now), quota.RetryAfter, "until midnight UTC")
	f.clock.SetTime(time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 1, 0, time.UTC))
	require.NoError(t, tunnels.Admit(ctx, a), "a new day")

	assert.Equal(t, 1.0, testenv.Counter(t, "proxy_operator_tenant_quota_refusals_total", map[string]string{"tenant": "system:serviceaccount:team-a:crawler", "limit": broker.LimitLeases}))
}

// Attack: team A asks again and again for team B's autoscaled pool, hoping
// each refusal grows it (members on B's account). Only a refusal of a
// pool the asker may lease reaches the pool's autoscaler; B's own does.
func TestARefusalGrowsOnlyPoolsTheAskerMayLease(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	f.configure(func(o *Options) { o.Tenants = twoTeams() })
	f.member("us", "us-0", "127.0.0.12")
	as := func(token string) []string { return []string{"Authorization", "Bearer " + token} }
	held := f.do("POST", "/v1/leases", `{"selector":{"pool":"us"},"exclusive":true}`, as("token-b")...)
	require.Equal(t, http.StatusCreated, held.status, "team B holds its only member")

	for range 5 {
		r := f.do("POST", "/v1/leases", `{"selector":{"pool":"us"}}`, as("token-a")...)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
	}
	d, err := f.srv.Broker().PoolDemand(context.Background(), "crawl", "us")
	require.NoError(t, err)
	assert.True(t, d.LastRefused.IsZero(), "team A's refusals never reach team B's autoscaler")

	r := f.do("POST", "/v1/leases", `{"selector":{"pool":"us"}}`, as("token-b")...)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "B's member is held")
	d, err = f.srv.Broker().PoolDemand(context.Background(), "crawl", "us")
	require.NoError(t, err)
	assert.False(t, d.LastRefused.IsZero(), "team B's own refusal does")
}
