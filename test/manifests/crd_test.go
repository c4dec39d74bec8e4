package manifests

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// crdFile is the CRD controller-gen writes; every other copy must be it.
const crdFile = "config/crd/bases/crawl.example.com_proxies.yaml"

// TestCRDCopiesAreTheGeneratedOne: the chart and the bundle ship
// controller-gen's file byte for byte (make manifests and make bundle copy
// it), and what the chart and every overlay render is that CRD.
func TestCRDCopiesAreTheGeneratedOne(t *testing.T) {
	want := repoFile(t, crdFile)
	for _, copied := range []string{chartDir + "/files/crds/crawl.example.com_proxies.yaml", bundleDir + "/manifests/crawl.example.com_proxies.yaml"} {
		assert.Equal(t, string(want), string(repoFile(t, copied)), "%s must be a copy of %s: run make manifests bundle", copied, crdFile)
	}

	var generated apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.Unmarshal(want, &generated))
	check := func(what string, o objects) {
		var got apiextensionsv1.CustomResourceDefinition
		require.True(t, o.one(t, "CustomResourceDefinition", &got), what)
		assert.Equal(t, generated.Name, got.Name, what)
		assert.Equal(t, generated.Spec, got.Spec, what)
		assert.Equal(t, generated.Annotations["controller-gen.kubebuilder.io/version"], got.Annotations["controller-gen.kubebuilder.io/version"], what)
	}
	for _, dir := range []string{"config/default", "overlays/kind", "overlays/gcp-eu", "overlays/gcp-us"} {
		check(dir, build(t, dir))
	}
	check("the chart", chartInstall{}.mustRender(t).objects)
}
