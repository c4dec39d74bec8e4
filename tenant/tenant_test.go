package tenant_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// reviewTTL is how long the checkers here reuse an answer.
const reviewTTL = 500 * time.Millisecond

// TestCheckerAgainstTheAPIServer: two teams' ServiceAccounts, each bound to
// one pool by an ordinary Role and RoleBinding, lease that pool and not the
// other; a binding on every Proxy of a namespace reaches its pools too; a
// token for another audience, an expired one and one of a deleted
// ServiceAccount name nobody; a revoked binding stops the next lease once
// the answer's TTL has passed.
func TestCheckerAgainstTheAPIServer(t *testing.T) {
	env := testenv.Start(t)
	admin := kubernetes.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	fleet, teamA, teamB := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	a := serviceAccount(t, admin, teamA, "crawler")
	b := serviceAccount(t, admin, teamB, "crawler")
	bindA := grantPool(t, admin, fleet, "eu", teamA, "crawler")
	grantPool(t, admin, fleet, "us", teamB, "crawler")

	checker := newChecker(t, env)
	tokenA, tokenB := token(t, admin, a, tenant.DefaultAudience), token(t, admin, b, tenant.DefaultAudience)
	eu, us := tenant.Proxy{Namespace: fleet, Name: "eu-0", Pool: "eu"}, tenant.Proxy{Namespace: fleet, Name: "us-0", Pool: "us"}
	loner := tenant.Proxy{Namespace: fleet, Name: "loner"}

	who := identify(t, checker, tokenA)
	require.NotNil(t, who, "team A's token")
	assert.Equal(t, "system:serviceaccount:"+teamA+":crawler", who.Name)
	assert.False(t, who.All())
	// RBAC reaches the authorizer through its informers: a moment after
	// the binding.
	require.Eventually(t, func() bool { return mayLease(t, newChecker(t, env), who, eu) }, 30*time.Second, 100*time.Millisecond)
	assert.True(t, mayLease(t, checker, who, eu), "team A leases its pool")
	assert.False(t, mayLease(t, checker, who, us), "not team B's")
	assert.False(t, mayLease(t, checker, who, loner), "nor a Proxy of no pool it was not granted")
	whoB := identify(t, checker, tokenB)
	require.NotNil(t, whoB)
	require.Eventually(t, func() bool { return mayLease(t, newChecker(t, env), whoB, us) }, 30*time.Second, 100*time.Millisecond)
	assert.False(t, mayLease(t, checker, whoB, eu))

	// Every Proxy of the namespace: pools and loners alike.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: fleet, Name: "lease-all"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"crawl.example.com"}, Resources: []string{"proxies/lease"}, Verbs: []string{"create"}}}}
	_, err := admin.RbacV1().Roles(fleet).Create(ctx, role, metav1.CreateOptions{})
	require.NoError(t, err)
	bind(t, admin, fleet, "lease-all", teamB, "crawler")
	require.Eventually(t, func() bool { return mayLease(t, newChecker(t, env), whoB, loner) }, 30*time.Second, 100*time.Millisecond)
	assert.True(t, mayLease(t, newChecker(t, env), whoB, eu), "a grant on every Proxy covers pool members")

	assert.Nil(t, identify(t, checker, token(t, admin, a, "some-other-service")), "a token for another audience")
	sa, err := admin.CoreV1().ServiceAccounts(teamA).Get(ctx, "crawler", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotNil(t, identify(t, newChecker(t, env), env.MintServiceAccountToken(t, sa, tenant.DefaultAudience, time.Now().Add(time.Hour))),
		"a token minted with the API server's key is accepted (so the next refusal is the expiry's)")
	assert.Nil(t, identify(t, newChecker(t, env), env.MintServiceAccountToken(t, sa, tenant.DefaultAudience, time.Now().Add(-time.Minute))), "an expired token")
	assert.Nil(t, identify(t, newChecker(t, env), "not-a-token"))

	require.NoError(t, admin.CoreV1().ServiceAccounts(teamB).Delete(ctx, "crawler", metav1.DeleteOptions{}))
	// The API server keeps a token it authenticated for 10s itself.
	require.Eventually(t, func() bool { return identify(t, checker, tokenB) == nil }, 30*time.Second, 100*time.Millisecond,
		"a deleted ServiceAccount's token names nobody once the answer's TTL has passed")

	require.NoError(t, admin.RbacV1().RoleBindings(fleet).Delete(ctx, bindA, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return !mayLease(t, checker, who, eu) }, 30*time.Second, 100*time.Millisecond,
		"a revoked binding stops the next lease once the answer's TTL has passed")
}

func newChecker(t *testing.T, env *testenv.Env) *tenant.Checker {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.Config)
	return tenant.NewChecker(kubeauth.NewReviewer(admin.AuthenticationV1().TokenReviews(), admin.AuthorizationV1().SubjectAccessReviews(), tenant.DefaultAudience, reviewTTL))
}

func identify(t *testing.T, c *tenant.Checker, token string) *tenant.Tenant {
	t.Helper()
	who, err := c.Identify(context.Background(), token)
	require.NoError(t, err)
	return who
}

func mayLease(t *testing.T, c *tenant.Checker, who *tenant.Tenant, p tenant.Proxy) bool {
	t.Helper()
	ok, err := c.MayLease(context.Background(), who, p)
	require.NoError(t, err)
	return ok
}

func serviceAccount(t *testing.T, admin kubernetes.Interface, ns, name string) *corev1.ServiceAccount {
	t.Helper()
	sa, err := admin.CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return sa
}

// grantPool is what docs/tenants.md tells a platform team to run: a Role
// on one pool's lease subresource, bound to a team's ServiceAccount. It
// returns the binding's name.
func grantPool(t *testing.T, admin kubernetes.Interface, ns, pool, saNamespace, sa string) string {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lease-" + pool},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"crawl.example.com"}, Resources: []string{"proxypools/lease"}, ResourceNames: []string{pool}, Verbs: []string{"create"}}}}
	_, err := admin.RbacV1().Roles(ns).Create(context.Background(), role, metav1.CreateOptions{})
	require.NoError(t, err)
	return bind(t, admin, ns, role.Name, saNamespace, sa)
}

func bind(t *testing.T, admin kubernetes.Interface, ns, role, saNamespace, sa string) string {
	t.Helper()
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role + "-" + saNamespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: sa}}}
	_, err := admin.RbacV1().RoleBindings(ns).Create(context.Background(), binding, metav1.CreateOptions{})
	require.NoError(t, err)
	return binding.Name
}

// token is a token for sa issued for audience, as a projected volume
// would hold it.
func token(t *testing.T, admin kubernetes.Interface, sa *corev1.ServiceAccount, audience string) string {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(context.Background(), sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}
