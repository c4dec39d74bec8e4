package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// team is a crawler team: a ServiceAccount in a namespace of its own.
type team struct {
	sa    *corev1.ServiceAccount
	token string // issued for the operator's audience
}

// newTeam makes a team's namespace and ServiceAccount and a token for it.
func newTeam(t *testing.T, admin kubernetes.Interface) team {
	t.Helper()
	ns := namespace(t)
	sa, err := admin.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "crawler"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return team{sa: sa, token: saToken(t, admin, sa, tenant.DefaultAudience)}
}

func saToken(t *testing.T, admin kubernetes.Interface, sa *corev1.ServiceAccount, audience string) string {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(context.Background(), sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// grant is what docs/tenants.md tells a platform team to run: a Role on one
// pool's lease subresource in the fleet's namespace, and a RoleBinding of
// it to the team's ServiceAccount. It returns the binding's name.
func grant(t *testing.T, admin kubernetes.Interface, fleet, pool string, to team) string {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: fleet, Name: "lease-" + pool},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"crawl.example.com"}, Resources: []string{"proxypools/lease"}, ResourceNames: []string{pool}, Verbs: []string{"create"}}}}
	_, err := admin.RbacV1().Roles(fleet).Create(ctx, role, metav1.CreateOptions{})
	require.NoError(t, err)
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: fleet, Name: "lease-" + pool + "-" + to.sa.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: to.sa.Namespace, Name: to.sa.Name}}}
	_, err = admin.RbacV1().RoleBindings(fleet).Create(ctx, binding, metav1.CreateOptions{})
	require.NoError(t, err)
	return binding.Name
}

// bindShippedLeaser creates config/rbac's proxy-leaser ClusterRole (as the
// chart and kustomize install it) and binds it to a team in fleet: one
// RoleBinding grants every pool there.
func bindShippedLeaser(t *testing.T, admin kubernetes.Interface, fleet string, to team) {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config/rbac/proxy_leaser_role.yaml"))
	require.NoError(t, err)
	var role rbacv1.ClusterRole
	require.NoError(t, yaml.Unmarshal(raw, &role))
	role.Name = "proxy-leaser-" + fleet
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	_, err = admin.RbacV1().RoleBindings(fleet).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: fleet, Name: "team"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: to.sa.Namespace, Name: to.sa.Name}}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// testTenants: two teams, each a ServiceAccount in a namespace of its own
// bound to one pool, list and lease only their pool, and their gateway
// sessions reach only their pool; team A's TenantQuota holds at its limit
// and not below; a revoked RoleBinding refuses the next lease; a token for
// another audience, an expired one and one of a deleted ServiceAccount are
// refused, by the API and the gateway alike.
func testTenants(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	admin := kubernetes.NewForConfigOrDie(world.cluster.Env.Config)
	// Two fleets: eu in one namespace (beside another pool nobody is
	// granted), us in another.
	fleet, fleetB := namespace(t), namespace(t)
	for _, pool := range []*crawlv1alpha1.ProxyPool{newPool(fleet, "eu", 1), newPool(fleetB, "us", 1)} {
		pool.Spec.Template.Spec.Attributes["suite"] = fleet
		require.NoError(t, c.Create(ctx, pool))
		waitPool(t, pool, 2*time.Minute, "one serving member", settledAt(1))
	}
	a, b := newTeam(t, admin), newTeam(t, admin)
	bindingA := grant(t, admin, fleet, "eu", a)
	// Team B gets its fleet with one RoleBinding of the shipped ClusterRole.
	bindShippedLeaser(t, admin, fleetB, b)
	one := int32(1)
	require.NoError(t, c.Create(ctx, &crawlv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: a.sa.Namespace, Name: a.sa.Name},
		Spec: crawlv1alpha1.TenantQuotaSpec{MaxLeases: &one}}))

	pools := func(token string) []string {
		r := call(t, "GET", "/v1/proxies?healthy=true&suite="+fleet, "", token)
		require.Equal(t, http.StatusOK, r.status, "%v", r.body)
		var out []string
		for _, p := range r.body["proxies"].([]any) {
			out = append(out, p.(map[string]any)["attributes"].(map[string]any)["pool"].(string))
		}
		return out
	}
	// RBAC reaches the API server's authorizer a moment after the binding.
	require.Eventually(t, func() bool { return len(pools(a.token)) == 1 && len(pools(b.token)) == 1 }, 30*time.Second, poll)
	assert.Equal(t, []string{"eu"}, pools(a.token), "team A sees its pool only")
	assert.Equal(t, []string{"us"}, pools(b.token), "team B sees its pool only")
	assert.ElementsMatch(t, []string{"eu", "us"}, pools(world.token), "the discovery token sees the fleet")

	selector := fmt.Sprintf(`{"selector":{"suite":%q},"ttlSeconds":120}`, fleet)
	lease := call(t, "POST", "/v1/leases", selector, a.token)
	require.Equal(t, http.StatusCreated, lease.status, "%v", lease.body)
	assert.True(t, strings.HasPrefix(leaseProxy(lease), fleet+"/eu-"), "team A leases from its pool: %s", leaseProxy(lease))
	// The TenantQuota reaches the operator's cache a moment after it is made.
	var over apiResponse
	require.Eventually(t, func() bool {
		over = call(t, "POST", "/v1/leases", selector, a.token)
		if over.status == http.StatusCreated {
			call(t, "DELETE", "/v1/leases/"+over.body["leaseID"].(string), "", a.token)
		}
		return over.status == http.StatusTooManyRequests
	}, 30*time.Second, poll, "team A's maxLeases: 1 holds")
	assert.Equal(t, "quota_exceeded", errorCodeOf(over))
	assert.NotEmpty(t, over.header.Get("Retry-After"))
	require.Equal(t, http.StatusNoContent, call(t, "DELETE", "/v1/leases/"+lease.body["leaseID"].(string), "", a.token).status)
	again := call(t, "POST", "/v1/leases", selector, a.token)
	require.Equal(t, http.StatusCreated, again.status, "below the limit a lease is granted: %v", again.body)
	require.Equal(t, http.StatusNoContent, call(t, "DELETE", "/v1/leases/"+again.body["leaseID"].(string), "", a.token).status)

	leaseB := call(t, "POST", "/v1/leases", selector, b.token)
	require.Equal(t, http.StatusCreated, leaseB.status)
	assert.True(t, strings.HasPrefix(leaseProxy(leaseB), fleetB+"/us-"), "team B leases from its pool: %s", leaseProxy(leaseB))
	assert.Equal(t, http.StatusNotFound, call(t, "GET", "/v1/leases/"+leaseB.body["leaseID"].(string), "", a.token).status, "team A cannot see team B's lease")
	refused := call(t, "POST", "/v1/leases", fmt.Sprintf(`{"selector":{"suite":%q,"pool":"us"}}`, fleet), a.token)
	assert.Equal(t, http.StatusServiceUnavailable, refused.status, "team B's pool is not team A's to lease")

	// The gateway: each team's password is its token, and its tunnels go
	// through its own pool only.
	pem, err := os.ReadFile(world.cluster.Target.CAFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	through := func(username, password string) (int, string, error) {
		var upstream string
		tr := &http.Transport{
			Proxy:           http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(username, password), Host: world.gateway}),
			TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
			OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
				upstream = resp.Header.Get(gateway.HeaderUpstream)
				return nil
			},
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get(world.cluster.Target.URL)
		if err != nil {
			return 0, upstream, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, upstream, nil
	}
	for _, tc := range []struct {
		who  team
		pool string
	}{{a, fleet + "/eu-"}, {b, fleetB + "/us-"}} {
		// One tunnel each: the gateway test taught the probe target a
		// pace of its own, one request per IP per minute.
		status, upstream, err := through("s1.suite-"+fleet, tc.who.token)
		require.NoError(t, err)
		require.Less(t, status, 300)
		assert.True(t, strings.HasPrefix(upstream, tc.pool), "%s's session s1 goes through its pool: %s", tc.who.sa.Namespace, upstream)
	}

	// Usage: each team reads its own tunnel to the site, the platform both.
	target, err := url.Parse(world.cluster.Target.URL)
	require.NoError(t, err)
	usageOf := func(token string) map[string]map[string]any {
		t.Helper()
		r := call(t, "GET", "/v1/usage?groupBy=tenant,host", "", token)
		require.Equal(t, http.StatusOK, r.status)
		rows := map[string]map[string]any{}
		for _, row := range r.body["rows"].([]any) {
			row := row.(map[string]any)
			host, _ := row["host"].(string) // a lease without a target has none
			rows[row["tenant"].(string)+" "+host] = row
		}
		return rows
	}
	for _, who := range []team{a, b} {
		name := "system:serviceaccount:" + who.sa.Namespace + ":" + who.sa.Name
		var row map[string]any
		require.Eventually(t, func() bool {
			// A tunnel counts once it closed.
			row = usageOf(who.token)[name+" "+target.Hostname()]
			return row != nil && row["tunnels"].(float64) >= 1
		}, 10*time.Second, poll, "%s's tunnel to the site is in its usage", name)
		assert.InDelta(t, 1, row["tunnels"], 0)
		assert.Positive(t, row["bytesDown"].(float64), "the site's answer and the TLS around it")
		bytes := row["bytesUp"].(float64) + row["bytesDown"].(float64)
		require.Contains(t, row, "cost", "a priced provider's proxies have a cost")
		assert.Positive(t, row["cost"])
		assert.InDelta(t, row["proxyHours"].(float64)*cluster.PriceProxyHour+bytes/(1<<30)*cluster.PriceGiB, row["cost"], 1e-6,
			"the cost is the configured prices times the proxy hours and the bytes (rounded to a millionth)")
		for key := range usageOf(who.token) {
			assert.True(t, strings.HasPrefix(key, name+" "), "%s reads only its own usage, got %s", name, key)
		}
	}
	all := usageOf(world.token)
	for _, who := range []team{a, b} {
		assert.Contains(t, all, "system:serviceaccount:"+who.sa.Namespace+":"+who.sa.Name+" "+target.Hostname(), "the platform reads every team's")
	}

	// Refused: another audience's token, an expired one, a deleted
	// ServiceAccount's.
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", saToken(t, admin, a.sa, "another-service")).status, "a token for another audience")
	expired := world.cluster.Env.MintServiceAccountToken(t, a.sa, tenant.DefaultAudience, time.Now().Add(-time.Minute))
	assert.Equal(t, http.StatusUnauthorized, call(t, "GET", "/v1/proxies", "", expired).status, "an expired token")
	_, _, err = through("s2", expired)
	require.Error(t, err, "nor through the gateway")
	assert.Contains(t, err.Error(), "Proxy Authentication Required")
	require.NoError(t, admin.CoreV1().ServiceAccounts(b.sa.Namespace).Delete(ctx, b.sa.Name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return call(t, "GET", "/v1/proxies", "", b.token).status == http.StatusUnauthorized }, 30*time.Second, poll,
		"a deleted ServiceAccount's token is refused (within the API server's 10s token cache and --tenant-review-ttl)")

	// Revoked: team A's next lease is refused.
	require.NoError(t, admin.RbacV1().RoleBindings(fleet).Delete(ctx, bindingA, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		r := call(t, "POST", "/v1/leases", selector, a.token)
		if r.status == http.StatusCreated {
			call(t, "DELETE", "/v1/leases/"+r.body["leaseID"].(string), "", a.token)
		}
		return r.status == http.StatusServiceUnavailable
	}, 30*time.Second, poll, "a revoked RoleBinding refuses the next lease")
	assert.Empty(t, pools(a.token), "and team A sees nothing")
}
