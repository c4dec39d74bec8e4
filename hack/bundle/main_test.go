package main

import (
	"testing"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func obj(apiVersion, kind, name string, fields map[string]any) *unstructured.Unstructured {
	o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{
		"name": name, "namespace": "system", "labels": map[string]any{managedByLabel: "kustomize", "keep": "me"},
	}}
	for k, v := range fields {
		o[k] = v
	}
	return &unstructured.Unstructured{Object: o}
}

var (
	deployment = obj("apps/v1", "Deployment", "manager", map[string]any{"spec": map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "m"}},
		"template": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"app": "m", managedByLabel: "kustomize"}},
			"spec":     map[string]any{"serviceAccountName": "sa", "containers": []any{map[string]any{"name": "manager", "image": "controller:latest"}}},
		},
	}})
	rule = []any{
		map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get"}},
		map[string]any{"apiGroups": []any{"authentication.k8s.io"}, "resources": []any{"tokenreviews"}, "verbs": []any{"create"}},
	}
	saSubject   = []any{map[string]any{"kind": "ServiceAccount", "name": "sa", "namespace": "system"}}
	clusterRole = obj("rbac.authorization.k8s.io/v1", "ClusterRole", "manager-role", map[string]any{"rules": rule})
	binding     = obj("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "manager-rolebinding", map[string]any{
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "manager-role"},
		"subjects": saSubject,
	})
	reader = obj("rbac.authorization.k8s.io/v1", "ClusterRole", "metrics-reader", map[string]any{"rules": rule})
)

func copies(objs ...*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopy()
	}
	return out
}

func TestPlace(t *testing.T) {
	svc := obj("v1", "Service", "discovery", nil)
	strategy, extra, err := place(copies(deployment, clusterRole, binding, reader, svc,
		obj("v1", "Namespace", "system", nil), obj("v1", "ServiceAccount", "sa", nil)))
	require.NoError(t, err)

	require.Len(t, strategy.DeploymentSpecs, 1)
	assert.Equal(t, "manager", strategy.DeploymentSpecs[0].Name)
	assert.NotContains(t, strategy.DeploymentSpecs[0].Spec.Template.Labels, managedByLabel, "OLM, not kustomize, manages what the bundle installs")
	require.Len(t, strategy.Permissions, 1, "the bound ClusterRole's namespaced rules become permissions, granted in the target namespaces")
	assert.Equal(t, "sa", strategy.Permissions[0].ServiceAccountName)
	require.Len(t, strategy.Permissions[0].Rules, 1)
	assert.Equal(t, []string{"pods"}, strategy.Permissions[0].Rules[0].Resources)
	require.Len(t, strategy.ClusterPermissions, 1, "what no Role can grant stays a cluster permission")
	assert.Equal(t, "sa", strategy.ClusterPermissions[0].ServiceAccountName)
	require.Len(t, strategy.ClusterPermissions[0].Rules, 1)
	assert.Equal(t, []string{"tokenreviews"}, strategy.ClusterPermissions[0].Rules[0].Resources)

	var names []string
	for _, u := range extra {
		names = append(names, u.GetKind()+"/"+u.GetName())
		assert.Empty(t, u.GetNamespace(), "OLM picks the namespace")
		assert.Equal(t, map[string]string{"keep": "me"}, u.GetLabels())
	}
	assert.ElementsMatch(t, []string{"Service/discovery", "ClusterRole/metrics-reader"}, names,
		"Services and unbound ClusterRoles ship beside the CSV; the namespace, ServiceAccount and bindings do not")
}

func TestPlaceRefusesWhatItCannotPlace(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []*unstructured.Unstructured
		want string
	}{
		{"an unknown kind", copies(deployment, obj("networking.k8s.io/v1", "Ingress", "api", nil)), "Ingress api: no place in an OLM bundle"},
		{"a binding to a missing role", copies(deployment, binding), "ClusterRoleBinding manager-rolebinding binds ClusterRole manager-role, which is not in the manifests"},
		{"no Deployment", copies(clusterRole), "want one Deployment in the manifests, found 0"},
		{"two Deployments", copies(deployment, deployment), "want one Deployment in the manifests, found 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := place(tc.objs)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestCheckOwned(t *testing.T) {
	crd := obj("apiextensions.k8s.io/v1", "CustomResourceDefinition", "proxies.crawl.example.com", map[string]any{"spec": map[string]any{
		"names":    map[string]any{"kind": "Proxy"},
		"versions": []any{map[string]any{"name": "v1alpha1"}},
	}})
	var csv operatorsv1alpha1.ClusterServiceVersion
	csv.Spec.CustomResourceDefinitions.Owned = []operatorsv1alpha1.CRDDescription{{Name: "proxies.crawl.example.com", Version: "v1alpha1", Kind: "Proxy"}}
	require.NoError(t, checkOwned(csv, copies(crd)))

	csv.Spec.CustomResourceDefinitions.Owned[0].Version = "v1"
	err := checkOwned(csv, copies(crd))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "update spec.customresourcedefinitions.owned")
}

func TestGenerateChecksItsFlags(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Version: "v0.1.0", Image: "i", Channels: []string{"candidate"}, DefaultChannel: "candidate"}, "not semver (no leading v)"},
		{Options{Version: "0.1.0", Channels: []string{"candidate"}, DefaultChannel: "candidate"}, "-image is required"},
		{Options{Version: "0.1.0", Image: "i", Channels: []string{"candidate"}, DefaultChannel: "stable"}, `-default-channel "stable" is not among -channels`},
	} {
		_, err := Generate(tc.o)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}
