package manifests

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// crdFiles are the CRDs controller-gen writes; every other copy must be them.
var crdFiles = []string{
	"config/crd/bases/crawl.example.com_proxies.yaml",
	"config/crd/bases/crawl.example.com_proxypools.yaml",
	"config/crd/bases/crawl.example.com_crawltargets.yaml",
	"config/crd/bases/crawl.example.com_tenantquotas.yaml",
}

// TestCRDCopiesAreTheGeneratedOne: the chart and the bundle ship
// controller-gen's files byte for byte (make manifests and make bundle copy
// them), and what the chart and every overlay render are those CRDs, no
// more and no fewer.
func TestCRDCopiesAreTheGeneratedOne(t *testing.T) {
	generated := map[string]apiextensionsv1.CustomResourceDefinition{}
	for _, file := range crdFiles {
		want := repoFile(t, file)
		base := filepath.Base(file)
		for _, copied := range []string{chartDir + "/files/crds/" + base, bundleDir + "/manifests/" + base} {
			assert.Equal(t, string(want), string(repoFile(t, copied)), "%s must be a copy of %s: run make manifests bundle", copied, file)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.Unmarshal(want, &crd), file)
		generated[crd.Name] = crd
	}

	check := func(what string, o objects) {
		got := crdsByName(t, o)
		require.Len(t, got, len(generated), "%s renders every CRD, and only those", what)
		for name, want := range generated {
			crd, ok := got[name]
			if !assert.True(t, ok, "%s lacks the CRD %s", what, name) {
				continue
			}
			assert.Equal(t, want.Spec, crd.Spec, "%s: %s", what, name)
			assert.Equal(t, want.Annotations["controller-gen.kubebuilder.io/version"], crd.Annotations["controller-gen.kubebuilder.io/version"], "%s: %s", what, name)
		}
	}
	for _, dir := range []string{"config/default", "overlays/kind", "overlays/gcp-eu", "overlays/gcp-us", "overlays/aws-eu"} {
		check(dir, build(t, dir))
	}
	check("the chart", chartInstall{}.mustRender(t).objects)
}

// crdsByName decodes every CustomResourceDefinition among o.
func crdsByName(t *testing.T, o objects) map[string]apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	out := map[string]apiextensionsv1.CustomResourceDefinition{}
	for _, u := range o.ofKind("CustomResourceDefinition") {
		var crd apiextensionsv1.CustomResourceDefinition
		decode(t, u, &crd)
		out[crd.Name] = crd
	}
	return out
}
