package manifests

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// tenant is one namespace-scoped release: installed in home, watching
// watched.
type tenant struct {
	release, home string
	watched       []string
}

func (tn tenant) install(crds bool) chartInstall {
	watched := make([]any, len(tn.watched)) // as values read from YAML are
	for i, ns := range tn.watched {
		watched[i] = ns
	}
	return chartInstall{release: tn.release, namespace: tn.home, set: map[string]any{
		"watchNamespaces": watched, "crds": map[string]any{"enabled": crds},
	}}
}

// serviceAccount is the user the release's operator runs as.
func (tn tenant) serviceAccount() string {
	return fmt.Sprintf("system:serviceaccount:%s:%s-egress-proxies-operator", tn.home, tn.release)
}

func TestChartNamespaceScoped(t *testing.T) {
	tn := tenant{release: "tenant-a", home: "tenant-a-system", watched: []string{"crawl-a", "crawl-a2"}}
	r := tn.install(true).mustRender(t)
	var deploy appsv1.Deployment
	require.True(t, r.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, "crawl-a,crawl-a2", managerArg(t, deploy, "--watch-namespaces"))
	assert.Contains(t, r.notes, "It keeps to the namespaces crawl-a, crawl-a2")
	assert.Contains(t, deploy.Spec.Template.Spec.Containers[0].Env,
		corev1.EnvVar{Name: "OPERATOR_NAME", Value: "tenant-a-egress-proxies-operator"}, "the release names the operator id and its Lease")

	var namespaces []string
	for _, u := range r.objects.ofKind("Role") {
		var role rbacv1.Role
		decode(t, u, &role)
		if role.Name != "tenant-a-egress-proxies-operator-manager" {
			continue
		}
		namespaces = append(namespaces, role.Namespace)
		for _, rule := range role.Rules {
			if slices.Contains(rule.Resources, "secrets") && role.Namespace != tn.home {
				assert.Subset(t, rule.Verbs, []string{"create", "patch", "delete"}, "a watched namespace's proxy pods' lease key Secrets are written")
				assert.NotContains(t, rule.Verbs, "update")
			}
			if slices.Contains(rule.Resources, "namespaces") {
				assert.Equal(t, tn.home, role.Namespace, "only its own namespace is read")
				assert.Equal(t, []string{tn.home}, rule.ResourceNames)
			}
		}
	}
	assert.ElementsMatch(t, []string{"crawl-a", "crawl-a2", "tenant-a-system"}, namespaces, "the manager's rules, in each watched namespace and its own")
	for _, u := range r.objects.ofKind("ClusterRoleBinding") {
		var b rbacv1.ClusterRoleBinding
		decode(t, u, &b)
		assert.Equal(t, "tenant-a-egress-proxies-operator-metrics-auth", b.RoleRef.Name, "the one cluster-wide binding: the metrics endpoint's reviews")
	}

	t.Run("the kustomize component", func(t *testing.T) {
		objs := kindWithComponent(t, "namespaced")
		var deploy appsv1.Deployment
		require.True(t, objs.one(t, "Deployment", &deploy))
		assert.Equal(t, "crawlers", managerArg(t, deploy, "--watch-namespaces"))
		var bound []string
		for _, u := range objs.ofKind("ClusterRoleBinding") {
			var b rbacv1.ClusterRoleBinding
			decode(t, u, &b)
			assert.NotEqual(t, "egress-proxies-operator-manager-role", b.RoleRef.Name, "no cluster-wide manager binding")
		}
		for _, u := range objs.ofKind("RoleBinding") {
			var b rbacv1.RoleBinding
			decode(t, u, &b)
			if b.RoleRef.Name == "egress-proxies-operator-manager-role" {
				bound = append(bound, b.Namespace)
			}
		}
		assert.ElementsMatch(t, []string{"crawlers", "egress-proxies-operator-system"}, bound)
	})
}

// TestTwoScopedReleasesShareACluster installs the chart twice into one API
// server, the second without CRDs, each watching its own namespaces: every
// object passes the server's dry run, no two collide, and each release's
// ServiceAccount, as the API server's RBAC authorizer judges it, may do its
// work in its namespaces and nothing anywhere else. The kustomize component
// is judged the same way.
func TestTwoScopedReleasesShareACluster(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	a := tenant{release: "tenant-a", home: "tenant-a-system", watched: []string{"crawl-a"}}
	b := tenant{release: "tenant-b", home: "tenant-b-system", watched: []string{"crawl-b", "crawl-b2"}}
	for _, ns := range []string{a.home, b.home, "crawl-a", "crawl-b", "crawl-b2", "crawl-other", "egress-proxies-operator-system", "crawlers"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	first := a.install(true).mustRender(t).objects
	second := b.install(false).mustRender(t).objects
	assert.Empty(t, second.ofKind("CustomResourceDefinition"), "the second release leaves the CRDs to the first")

	seen := map[string]string{}
	for name, objs := range map[string]objects{"first": first, "second": second} {
		for _, u := range objs {
			key := u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
			if other, dup := seen[key]; dup {
				t.Errorf("%s is rendered by both the %s and the %s release", key, other, name)
			}
			seen[key] = name
		}
	}
	require.Len(t, first.ofKind("CustomResourceDefinition"), 4, "the first release brings the CRDs (the test API server has them already)")
	for _, objs := range []objects{first, second} {
		for _, u := range objs {
			if notServedHere[u.GetKind()] || u.GetKind() == "CustomResourceDefinition" {
				continue
			}
			assert.NoError(t, env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.DryRunAll,
				client.ForceOwnership, client.FieldOwner("manifests-test")), "%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
		}
	}

	// Now the roles and bindings for real, and the authorizer's verdicts.
	createRBAC := func(objs objects) {
		for _, kind := range []string{"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"} {
			for _, u := range objs.ofKind(kind) {
				require.NoError(t, env.Client.Create(ctx, u.DeepCopy()), "%s %s/%s", kind, u.GetNamespace(), u.GetName())
			}
		}
	}
	createRBAC(first)
	createRBAC(second)
	for _, tn := range []tenant{a, b} {
		t.Run(tn.release, func(t *testing.T) {
			assertConfined(t, env, tn.serviceAccount(), tn.home, tn.watched)
		})
	}

	t.Run("the kustomize component", func(t *testing.T) {
		objs := kindWithComponent(t, "namespaced")
		for _, u := range objs.ofKind("CustomResourceDefinition") {
			require.NoError(t, client.IgnoreAlreadyExists(env.Client.Create(ctx, u.DeepCopy())))
		}
		for _, u := range objs {
			if !notServedHere[u.GetKind()] && u.GetKind() != "CustomResourceDefinition" {
				assert.NoError(t, env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.DryRunAll,
					client.ForceOwnership, client.FieldOwner("manifests-test")), "%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
			}
		}
		createRBAC(objs)
		assertConfined(t, env, "system:serviceaccount:egress-proxies-operator-system:egress-proxies-operator-controller-manager",
			"egress-proxies-operator-system", []string{"crawlers"})
	})
}

// assertConfined asks the API server's authorizer what user may do: its
// work in watched and home (in a watched namespace, writing its proxy
// pods' lease key Secrets too), and nothing in any other namespace or
// cluster-wide.
func assertConfined(t *testing.T, env *testenv.Env, user, home string, watched []string) {
	t.Helper()
	may := func(ns, verb, group, resource, name string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + home, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Group: group, Resource: resource, Name: name,
			},
		}}
		require.NoError(t, env.Client.Create(context.Background(), sar))
		return sar.Status.Allowed
	}

	// Its work, where it is its to do.
	for _, ns := range watched {
		for _, verb := range []string{"get", "list", "watch", "update", "patch"} {
			assert.True(t, may(ns, verb, "crawl.example.com", "proxies", ""), "%s proxies in %s", verb, ns)
		}
		assert.True(t, may(ns, "create", "", "pods", ""), "create pods in %s", ns)
		assert.True(t, may(ns, "list", "", "secrets", ""), "read the Secrets Proxies name in %s", ns)
		assert.True(t, may(ns, "create", "events.k8s.io", "events", ""), "record Events in %s", ns)
	}
	assert.True(t, may(home, "create", "", "secrets", ""), "write its generated credentials in %s", home)
	assert.True(t, may(home, "update", "coordination.k8s.io", "leases", ""), "hold its leader Lease in %s", home)
	assert.True(t, may(home, "get", "", "namespaces", home), "read its own namespace (the default cluster id)")

	// Nothing anywhere else.
	resources := []struct{ group, resource string }{
		{"crawl.example.com", "proxies"}, {"crawl.example.com", "proxypools"}, {"crawl.example.com", "crawltargets"}, {"", "secrets"}, {"", "pods"},
		{"", "configmaps"}, {"events.k8s.io", "events"}, {"coordination.k8s.io", "leases"},
		{"", "serviceaccounts"}, {"rbac.authorization.k8s.io", "roles"},
	}
	outside := []string{"", "crawl-other", "kube-system", "default"}
	for _, ns := range []string{"tenant-a-system", "tenant-b-system", "crawl-a", "crawl-b", "crawl-b2", "egress-proxies-operator-system", "crawlers"} {
		if ns != home && !slices.Contains(watched, ns) {
			outside = append(outside, ns)
		}
	}
	for _, ns := range outside {
		for _, r := range resources {
			for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete"} {
				assert.False(t, may(ns, verb, r.group, r.resource, ""), "%s may %s %s/%s in namespace %q", user, verb, r.group, r.resource, ns)
			}
		}
		if ns != "" {
			assert.False(t, may(ns, "get", "", "namespaces", ns), "%s may read namespace %s", user, ns)
		}
	}
	for _, r := range []string{"namespaces", "nodes"} {
		assert.False(t, may("", "list", "", r, ""), "%s may list %s", user, r)
	}
	for _, ns := range watched {
		assert.True(t, may(ns, "create", "", "secrets", ""), "%s creating its pods' lease key Secrets in the watched namespace %s", user, ns)
		assert.False(t, may(ns, "update", "", "secrets", ""), "%s updating Secrets in %s", user, ns)
	}
}
