package manifests

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
)

// roleSet is one install path's RBAC, by what each role is for.
type roleSet struct {
	rules  map[string][]string          // purpose -> normalised rules
	labels map[string]map[string]string // purpose -> aggregation labels
}

// The purposes, and what each install path names them.
var (
	rolePurposes = []string{"manager", "leader-election", "metrics-reader", "proxy-editor", "proxy-viewer", "proxy-leaser", "attribution-reader"}

	kustomizeRoleNames = map[string]string{
		"manager":            "egress-proxies-operator-manager-role",
		"leader-election":    "egress-proxies-operator-leader-election-role",
		"metrics-reader":     "egress-proxies-operator-metrics-reader",
		"proxy-editor":       "egress-proxies-operator-proxy-editor-role",
		"proxy-viewer":       "egress-proxies-operator-proxy-viewer-role",
		"proxy-leaser":       "egress-proxies-operator-proxy-leaser-role",
		"attribution-reader": "egress-proxies-operator-attribution-reader-role",
	}
)

// TestRBACAgreesEverywhere: kustomize, the chart and the CSV grant the same
// rules for the same purposes, bind the manager's to the ServiceAccount the
// Deployment runs as, and nothing else grants anything.
func TestRBACAgreesEverywhere(t *testing.T) {
	kustomize := build(t, "config/default")
	chart := chartInstall{}.mustRender(t).objects
	want := rolesOf(t, kustomize, kustomizeRoleNames)
	require.Len(t, want.rules, len(rolePurposes))

	chartNames := map[string]string{}
	for _, p := range rolePurposes {
		chartNames[p] = releaseName + "-" + p
	}
	assert.Equal(t, want, rolesOf(t, chart, chartNames), "the chart's RBAC")

	csv := loadBundle(t).CSV
	strategy := csv.Spec.InstallStrategy.StrategySpec
	// The manager's namespaced rules are permissions (OLM grants them in
	// the target namespaces, or cluster-wide for AllNamespaces); what no
	// Role can grant is a cluster permission.
	require.Len(t, strategy.ClusterPermissions, 1)
	require.Len(t, strategy.Permissions, 2)
	managerRules := slices.Concat(strategy.Permissions[0].Rules, strategy.ClusterPermissions[0].Rules)
	for _, r := range strategy.ClusterPermissions[0].Rules {
		assert.Subset(t, []string{"authentication.k8s.io", "authorization.k8s.io"}, r.APIGroups, "only what no Role can grant is a cluster permission: %v", r)
	}
	bundle := roleSet{rules: map[string][]string{
		"manager":         normalise(managerRules),
		"leader-election": normalise(strategy.Permissions[1].Rules),
	}, labels: map[string]map[string]string{}}
	bundleObjects := objects(nil)
	for _, u := range loadBundle(t).Objects {
		bundleObjects = append(bundleObjects, u)
	}
	for _, p := range []string{"metrics-reader", "proxy-editor", "proxy-viewer", "proxy-leaser", "attribution-reader"} {
		var r rbacv1.ClusterRole
		bundleObjects.named(t, "ClusterRole", kustomizeRoleNames[p], &r)
		bundle.rules[p] = normalise(r.Rules)
		bundle.labels[p] = aggregationLabels(r.Labels)
	}
	for _, p := range []string{"manager", "leader-election"} {
		bundle.labels[p] = map[string]string{}
	}
	assert.Equal(t, want, bundle, "the CSV's RBAC")

	sa := strategy.DeploymentSpecs[0].Spec.Template.Spec.ServiceAccountName
	assert.Equal(t, sa, strategy.ClusterPermissions[0].ServiceAccountName)
	assert.Equal(t, sa, strategy.Permissions[0].ServiceAccountName)
	assert.Equal(t, sa, strategy.Permissions[1].ServiceAccountName)

	for name, o := range map[string]objects{"kustomize": kustomize, "chart": chart} {
		assert.Len(t, slices.Concat(o.ofKind("ClusterRole"), o.ofKind("Role")), len(rolePurposes), "%s: no role beyond the known ones", name)
		bindings := slices.Concat(o.ofKind("ClusterRoleBinding"), o.ofKind("RoleBinding"))
		assert.Len(t, bindings, 2, "%s: only the manager's and leader election's roles are bound", name)
		var deploy struct {
			Spec struct {
				Template struct {
					Spec struct {
						ServiceAccountName string `json:"serviceAccountName"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		require.True(t, o.one(t, "Deployment", &deploy))
		for _, u := range bindings {
			var b rbacv1.RoleBinding // a ClusterRoleBinding decodes the same
			decode(t, u, &b)
			require.Len(t, b.Subjects, 1)
			assert.Equal(t, deploy.Spec.Template.Spec.ServiceAccountName, b.Subjects[0].Name, "%s: %s binds the Deployment's ServiceAccount", name, u.GetName())
		}
	}
}

// rolesOf collects the roles of one install path, by purpose.
func rolesOf(t *testing.T, o objects, names map[string]string) roleSet {
	t.Helper()
	set := roleSet{rules: map[string][]string{}, labels: map[string]map[string]string{}}
	for _, p := range rolePurposes {
		kind := "ClusterRole"
		if p == "leader-election" {
			kind = "Role"
		}
		var r rbacv1.ClusterRole // a Role decodes the same
		o.named(t, kind, names[p], &r)
		set.rules[p] = normalise(r.Rules)
		set.labels[p] = aggregationLabels(r.Labels)
	}
	return set
}

// normalise renders rules order-independently: one line per group,
// resource and verb (or non-resource URL and verb), sorted.
func normalise(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, verb := range r.Verbs {
			for _, url := range r.NonResourceURLs {
				out = append(out, fmt.Sprintf("url %s %s", url, verb))
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					names := strings.Join(r.ResourceNames, ",")
					out = append(out, fmt.Sprintf("%s/%s[%s] %s", g, res, names, verb))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func aggregationLabels(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
			out[k] = v
		}
	}
	return out
}

func TestNormaliseSeesEveryDifference(t *testing.T) {
	base := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}}
	assert.Equal(t, normalise(base), normalise([]rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
	}), "the same grants, split differently")
	for _, other := range [][]rbacv1.PolicyRule{
		{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
		{{APIGroups: []string{"apps"}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
		{{APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"a"}, Verbs: []string{"get", "list"}}},
		{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	} {
		assert.NotEqual(t, normalise(base), normalise(other), "%v", other)
	}
}
