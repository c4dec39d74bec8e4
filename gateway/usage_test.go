package gateway_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/squid"
)

// twoTeams knows two ServiceAccount tokens, each of which may lease every
// proxy and read only its own usage.
type twoTeams struct{}

func (twoTeams) Identify(_ context.Context, token string) (*tenant.Tenant, error) {
	switch token {
	case "team-a-token":
		return tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:crawl-a:crawler"}), nil
	case "team-b-token":
		return tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:crawl-b:crawler"}), nil
	}
	return nil, nil
}

func (twoTeams) MayLease(context.Context, *tenant.Tenant, tenant.Proxy) (bool, error) {
	return true, nil
}
func (twoTeams) MayReadAttribution(context.Context, *tenant.Tenant) (bool, error) { return false, nil }
func (twoTeams) MayReadUsage(context.Context, *tenant.Tenant) (bool, error)       { return false, nil }

// usageAnswer is GET /v1/usage's answer, as a client reads it.
type usageAnswer struct {
	Rows []struct {
		Tenant, Host, Provider                             string
		Requests, Tunnels, BytesUp, BytesDown, ProxyMillis int64
		Cost                                               *float64
	}
}

// TestUsagePerTeamAndSite: two teams crawl through the gateway; each reads
// its own usage per site (the requests and bytes the sites saw and sent),
// the platform reads both, and the cost is the configured prices applied
// to the proxy time and bytes.
func TestUsagePerTeamAndSite(t *testing.T) {
	price := broker.Price{ProxyHour: 0.5, GiB: 2}
	f := newFixtureWith(t, gateway.Options{}, clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
		o.Tenants, o.Prices = twoTeams{}, map[string]broker.Price{"gcp-test": price}
	})
	for ip, id := range f.byIP {
		p := externalProxy(id[len("crawl/"):], ip, true)
		p.Spec.Provider = "gcp-test"
		f.view.Upsert(p)
	}
	clientOf := func(password string) *http.Client {
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword("", password), Host: f.gwAddr}), DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local test site's certificate
		}}
	}
	crawl := func(c *http.Client, rawURL string) {
		t.Helper()
		resp, err := c.Get(rawURL)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	a, b := clientOf("team-a-token"), clientOf("team-b-token")
	for range 3 {
		crawl(a, f.plain.srv.URL+"/big/1000")
	}
	crawl(a, f.sites[0].srv.URL+"/big/20000")
	for range 2 {
		crawl(b, f.plain.srv.URL+"/big/500")
	}
	require.Eventually(t, func() bool { return f.gw.Open() == 0 }, 10*time.Second, 10*time.Millisecond, "every tunnel closed")
	require.Len(t, f.plain.upstreams(), 5, "the plain site saw five requests")

	read := func(bearer, query string) (int, usageAnswer) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, f.api.URL+"/v1/usage?"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var got usageAnswer
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		}
		return resp.StatusCode, got
	}
	type seen struct{ requests, tunnels, down int64 }
	byTenantHost := func(u usageAnswer) map[string]seen {
		out := map[string]seen{}
		for _, r := range u.Rows {
			out[r.Tenant+" "+r.Host] = seen{r.Requests, r.Tunnels, r.BytesDown}
			require.NotNil(t, r.Cost, "prices are configured")
			want := float64(r.ProxyMillis)/3.6e6*price.ProxyHour + float64(r.BytesUp+r.BytesDown)/(1<<30)*price.GiB
			assert.InDelta(t, want, *r.Cost, 1e-6, "%s %s", r.Tenant, r.Host)
			assert.GreaterOrEqual(t, r.ProxyMillis, int64(0))
		}
		return out
	}
	teamA, teamB := "system:serviceaccount:crawl-a:crawler", "system:serviceaccount:crawl-b:crawler"
	status, own := read("team-a-token", "groupBy=tenant,host")
	require.Equal(t, http.StatusOK, status)
	got := byTenantHost(own)
	assert.Equal(t, seen{requests: 3, tunnels: 3, down: 3000}, got[teamA+" "+f.plain.host()], "the plain site's three answers, byte for byte")
	tunnel := got[teamA+" "+f.sites[0].host()]
	assert.Equal(t, int64(1), tunnel.tunnels)
	assert.Zero(t, tunnel.requests, "inside an opaque tunnel the gateway counts no requests")
	assert.GreaterOrEqual(t, tunnel.down, int64(20000), "the page and the TLS around it")
	assert.Len(t, got, 2, "team a reads only its own")

	status, own = read("team-b-token", "groupBy=tenant,host")
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, map[string]seen{teamB + " " + f.plain.host(): {requests: 2, tunnels: 2, down: 1000}}, byTenantHost(own))

	status, all := read(token, "groupBy=tenant")
	require.Equal(t, http.StatusOK, status)
	tenants := map[string]bool{}
	for _, r := range all.Rows {
		tenants[r.Tenant] = true
		assert.Empty(t, r.Host, "grouped by tenant only")
	}
	assert.Equal(t, map[string]bool{teamA: true, teamB: true}, tenants, "the platform reads both")

	status, _ = read(token, "groupBy=color")
	assert.Equal(t, http.StatusBadRequest, status)
	status, _ = read(token, "from=2026-13-01")
	assert.Equal(t, http.StatusBadRequest, status)
	today := time.Now().UTC()
	status, _ = read(token, fmt.Sprintf("from=%s&to=%s", today.Format(time.DateOnly), today.AddDate(0, 0, -1).Format(time.DateOnly)))
	assert.Equal(t, http.StatusBadRequest, status, "to before from")
}
