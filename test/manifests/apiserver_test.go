package manifests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// notServedHere are the kinds whose APIs (the Prometheus Operator, Config
// Connector) a bare API server does not have; everything else must be
// accepted.
var notServedHere = map[string]bool{"ServiceMonitor": true, "IAMPolicyMember": true}

// TestTheAPIServerAcceptsEveryManifest server-side-applies, as a dry run,
// everything each install path would create: every overlay, the chart with
// each region's values, and the bundle's manifests with the CSV's
// Deployment and roles. The API server's own validation and admission run,
// so an invalid field anywhere fails here rather than at a user's install.
func TestTheAPIServerAcceptsEveryManifest(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	for _, ns := range []string{"egress-proxies-operator-system", releaseNamespace} {
		require.NoError(t, client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})))
	}

	sources := map[string]objects{}
	for _, dir := range []string{"overlays/kind", "overlays/gcp-eu", "overlays/gcp-us", "overlays/aws-eu"} {
		sources[dir] = build(t, dir)
	}
	for _, values := range []string{"values-gcp-eu.yaml", "values-gcp-us.yaml", "values-aws-eu.yaml"} {
		sources["chart with "+values] = chartInstall{valuesFiles: []string{values}, apiVersions: []string{serviceMonitorAPI}}.mustRender(t).objects
	}
	sources["chart with defaults"] = chartInstall{}.mustRender(t).objects
	sources["bundle"] = bundleAsObjects(t, env.Scheme, "egress-proxies-operator-system")

	for name, objs := range sources {
		t.Run(name, func(t *testing.T) {
			applied := 0
			for _, u := range objs {
				if notServedHere[u.GetKind()] {
					continue
				}
				u = u.DeepCopy()
				err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.DryRunAll, client.ForceOwnership, client.FieldOwner("manifests-test"))
				if !assert.NoError(t, err, "%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName()) && apierrors.IsNotFound(err) {
					t.Log("a NotFound here usually means the kind's API is not served: add it to notServedHere only if it is a third-party API")
				}
				applied++
			}
			assert.Greater(t, applied, 5, "the manifests were really applied")
		})
	}

	t.Run("a broken manifest is rejected", func(t *testing.T) {
		policies := sources["chart with defaults"].ofKind("NetworkPolicy")
		require.Len(t, policies, 1)
		np := policies[0].DeepCopy()
		require.NoError(t, unstructured.SetNestedStringSlice(np.Object, []string{"Sideways"}, "spec", "policyTypes"))
		err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(np), client.DryRunAll, client.ForceOwnership, client.FieldOwner("manifests-test"))
		require.Error(t, err, "the dry run validates")
		assert.Contains(t, err.Error(), "Sideways")
	})
}

// bundleAsObjects is what OLM would create from the bundle in namespace ns:
// its plain manifests, and the CSV's Deployment, ServiceAccount and roles.
func bundleAsObjects(t *testing.T, scheme *runtime.Scheme, ns string) objects {
	t.Helper()
	b := loadBundle(t)
	var out objects
	add := func(obj client.Object) {
		gvks, _, err := scheme.ObjectKinds(obj)
		require.NoError(t, err)
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		require.NoError(t, err)
		u := &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(gvks[0])
		out = append(out, u)
	}
	for _, u := range b.Objects {
		if u.GetKind() == "ClusterServiceVersion" {
			continue // OLM turns it into the objects added below
		}
		u = u.DeepCopy()
		if u.GetKind() != "ClusterRole" {
			u.SetNamespace(ns)
		}
		out = append(out, u)
	}
	strategy := b.CSV.Spec.InstallStrategy.StrategySpec
	for _, d := range strategy.DeploymentSpecs {
		add(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: d.Name, Namespace: ns, Labels: d.Label}, Spec: d.Spec})
	}
	for i, p := range strategy.ClusterPermissions {
		add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: p.ServiceAccountName, Namespace: ns}})
		add(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "csv-cluster-permissions-" + string(rune('a'+i))}, Rules: p.Rules})
	}
	for i, p := range strategy.Permissions {
		add(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "csv-permissions-" + string(rune('a'+i)), Namespace: ns}, Rules: p.Rules})
	}
	return out
}
