package manifests

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/aws"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// objects is a set of manifests, whichever of kustomize, helm or the bundle
// produced them, so every check runs the same way on all three.
type objects []*unstructured.Unstructured

// ofKind keeps the objects of one kind.
func (o objects) ofKind(kind string) objects {
	var out objects
	for _, u := range o {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// named finds the object of kind with name, failing the test when absent.
func (o objects) named(t *testing.T, kind, name string, out any) {
	t.Helper()
	for _, u := range o.ofKind(kind) {
		if u.GetName() == name {
			decode(t, u, out)
			return
		}
	}
	require.Failf(t, "missing object", "no %s %q among %d objects", kind, name, len(o))
}

// one decodes the single object of kind into out; false when there is none.
func (o objects) one(t *testing.T, kind string, out any) bool {
	t.Helper()
	found := o.ofKind(kind)
	if len(found) == 0 {
		return false
	}
	require.Len(t, found, 1, "want one %s", kind)
	decode(t, found[0], out)
	return true
}

// decode converts u into out. Into a Kubernetes type it is strict, so a
// misspelled field in a manifest fails the test instead of vanishing.
func decode(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	_, typed := out.(runtime.Object)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, typed),
		"decoding %s %s", u.GetKind(), u.GetName())
}

// parseManifests splits a multi-document YAML stream into objects, skipping
// empty documents as kubectl does.
func parseManifests(t *testing.T, data []byte) objects {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out objects
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// build runs kustomize on a directory of the repository, as
// `kustomize build` would.
func build(t *testing.T, dir string) objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), dir))
	require.NoError(t, err, "kustomize build %s", dir)
	data, err := m.AsYaml()
	require.NoError(t, err)
	return parseManifests(t, data)
}

// repoFile reads a file of the repository.
func repoFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), path))
	require.NoError(t, err)
	return data
}

// providerNames parses a providers ConfigMap the way the operator does, and
// decodes each instance's settings strictly into its provider's Settings, so
// a manifest that would stop the operator at startup fails here.
func providerNames(t *testing.T, cm corev1.ConfigMap) []string {
	t.Helper()
	cfg, err := providers.ParseConfig([]byte(cm.Data["providers.yaml"]))
	require.NoError(t, err, "ConfigMap %s", cm.Name)
	for _, inst := range cfg.Providers {
		var settings any
		switch inst.Type {
		case kubernetes.Type:
			settings = &kubernetes.Settings{}
		case gcp.Type:
			settings = &gcp.Settings{}
		case aws.Type:
			settings = &aws.Settings{}
		default:
			require.Failf(t, "unknown provider type", "%s: %q", inst.Name, inst.Type)
		}
		require.NoError(t, providers.DecodeSettings(inst.Settings, settings), "ConfigMap %s: provider %s", cm.Name, inst.Name)
	}
	return cfg.Names()
}
