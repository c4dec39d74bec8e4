package kubeauth

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestFilterAgainstTheAPIServer runs the filter as the operator builds it,
// against a real API server: a ServiceAccount bound to the shipped
// metrics-reader ClusterRole reads /metrics, one without the binding is
// refused, and a token the API server never issued is not a user. The
// reviews are made as the operator's ServiceAccount, with the shipped
// operator ClusterRole, so a missing rule there fails too.
func TestFilterAgainstTheAPIServer(t *testing.T) {
	env := testenv.Start(t)
	admin := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)

	operator := bindAccount(t, admin, ns, "operator", clusterRole(t, "config/rbac/role.yaml"))
	reader := bindAccount(t, admin, ns, "prometheus", clusterRole(t, "config/rbac/metrics_reader_role.yaml"))
	stranger := bindAccount(t, admin, ns, "stranger", nil)

	asOperator := rest.AnonymousClientConfig(env.Config)
	asOperator.BearerToken = operator

	// RBAC reaches the authorizer through its informers: a moment after
	// the binding. A fresh filter each time, so that no answer cached
	// before then hides it.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, served := serve(t, guardedAs(t, asOperator), http.MethodGet, "/metrics", "Bearer "+reader)
		assert.Equal(c, http.StatusOK, code)
		assert.True(c, served)
	}, 30*time.Second, 200*time.Millisecond)

	h := guardedAs(t, asOperator)
	code, served := serve(t, h, http.MethodGet, "/metrics", "Bearer "+reader)
	assert.Equal(t, http.StatusOK, code, "the reader scrapes")
	assert.True(t, served)
	code, _ = serve(t, h, http.MethodGet, "/metrics", "Bearer "+stranger)
	assert.Equal(t, http.StatusForbidden, code, "a ServiceAccount without the role is refused")
	code, _ = serve(t, h, http.MethodGet, "/metrics", "Bearer not-a-token-the-api-server-issued")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = serve(t, h, http.MethodGet, "/metrics", "")
	assert.Equal(t, http.StatusUnauthorized, code)
}

// guardedAs is a handler behind a new filter, built as the operator builds
// it, whose reviews are made as cfg's user.
func guardedAs(t *testing.T, cfg *rest.Config) http.Handler {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	filter, err := WithAuthenticationAndAuthorization(cfg, httpClient)
	require.NoError(t, err)
	h, err := filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Header().Set("X-Served", "yes") }))
	require.NoError(t, err)
	return h
}

// clusterRole reads a shipped ClusterRole's rules.
func clusterRole(t *testing.T, path string) []rbacv1.PolicyRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), path))
	require.NoError(t, err)
	var role rbacv1.ClusterRole
	require.NoError(t, yaml.Unmarshal(data, &role))
	require.NotEmpty(t, role.Rules, path)
	return role.Rules
}

// bindAccount makes a ServiceAccount, binds it to a ClusterRole of the
// given rules (none: no binding) and returns a token for it.
func bindAccount(t *testing.T, admin kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	_, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	if rules != nil {
		roleName := ns + "-" + name
		_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: roleName},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	token, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return token.Status.Token
}
