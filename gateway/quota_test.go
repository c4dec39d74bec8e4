package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// oneTeam knows one ServiceAccount token, which may lease everything.
type oneTeam struct{}

func (oneTeam) Identify(_ context.Context, token string) (*tenant.Tenant, error) {
	if token != "team-token" {
		return nil, nil
	}
	return tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:crawl-a:crawler"}), nil
}

func (oneTeam) MayLease(context.Context, *tenant.Tenant, tenant.Proxy) (bool, error) {
	return true, nil
}

func (oneTeam) MayReadAttribution(context.Context, *tenant.Tenant) (bool, error) { return false, nil }
func (oneTeam) MayReadUsage(context.Context, *tenant.Tenant) (bool, error)       { return false, nil }

// TestTheGatewayHoldsATenantToItsQuota: a team's ServiceAccount token is
// a gateway password; past its tunnelsPerSecond the gateway answers 429
// with Retry-After and a Proxy-Status naming the limit, before picking
// any proxy, and the platform's token is not bound by it.
func TestTheGatewayHoldsATenantToItsQuota(t *testing.T) {
	quotas := broker.NewQuotaIndex()
	one := int32(1)
	quotas.Handler().OnAdd(&crawlv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl-a", Name: "crawler"},
		Spec: crawlv1alpha1.TenantQuotaSpec{TunnelsPerSecond: &one}}, false)
	server := discovery.NewServer(discovery.Options{Store: lease.NewMemoryStore(nil), View: broker.NewView(nil, "operator-ns"),
		Tokens: discovery.StaticToken(token), Tenants: oneTeam{}, Quotas: quotas})
	gw := gateway.New(gateway.Options{Upstreams: server.Tunnels()})
	connect := func(password string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodConnect, "http://shop.example:443", nil)
		req.Host = "shop.example:443"
		req.Header.Set("Proxy-Authorization", basic("s1", password))
		gw.ServeHTTP(rec, req)
		return rec
	}
	first := connect("team-token")
	require.Equal(t, http.StatusServiceUnavailable, first.Code, "admitted, and no proxy to pick: %s", first.Body)
	over := connect("team-token")
	assert.Equal(t, http.StatusTooManyRequests, over.Code)
	assert.Equal(t, "1", over.Header().Get("Retry-After"))
	assert.Contains(t, over.Header().Get("Proxy-Status"), `error=connection_limit_reached; details="quota: `)
	assert.Contains(t, over.Header().Get("Proxy-Status"), "tunnels_per_second")
	assert.Contains(t, over.Body.String(), "TenantQuota crawl-a/crawler")
	assert.Equal(t, http.StatusServiceUnavailable, connect(token).Code, "the platform's token has no quota")
	assert.Equal(t, http.StatusProxyAuthRequired, connect("not-a-token").Code)
}
