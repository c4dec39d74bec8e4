package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/api/pkg/manifests"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/test/testenv"
)

const (
	bundleDir   = "bundle"
	packageName = "egress-proxies-operator"
	csvFile     = bundleDir + "/manifests/" + packageName + ".clusterserviceversion.yaml"
)

func loadBundle(t *testing.T) *manifests.Bundle {
	t.Helper()
	b, err := manifests.GetBundleFromDir(filepath.Join(testenv.RepoRoot(), bundleDir))
	require.NoError(t, err, "loading the bundle: run make bundle")
	require.NotNil(t, b.CSV)
	return b
}

// TestBundlePassesOperatorFrameworkValidation runs what `operator-sdk bundle
// validate --select-optional suite=operatorframework` runs, through the
// same library, and wants neither errors nor warnings.
func TestBundlePassesOperatorFrameworkValidation(t *testing.T) {
	b := loadBundle(t)
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
		validation.ObjectValidator,
	)
	eventsRule := eventsRuleIndex(t, b)
	objs := append(b.ObjectsToValidate(), map[string]string{"k8s-version": "1.36"})
	results := validators.Validate(objs...)
	require.NotEmpty(t, results)
	for _, r := range results {
		for _, e := range r.Errors {
			t.Errorf("%s: %s", r.Name, e.Error())
		}
		for _, w := range r.Warnings {
			if !knownFalseWarning(w.Error(), eventsRule) {
				t.Errorf("%s (warning): %s", r.Name, w.Error())
			}
		}
	}
	assert.Equal(t, packageName, b.Package)
	assert.Equal(t, []string{"candidate"}, b.Channels)
	assert.Equal(t, "candidate", b.DefaultChannel)
}

// knownFalseWarning: RBAC rules carry no API version, so the removed-APIs
// validator takes the manager's events.k8s.io rule for events.k8s.io/v1beta1
// (removed in 1.25). The operator records Events through events.k8s.io/v1,
// GA since 1.19. Only that exact warning, about that one rule (the index
// of the events.k8s.io rule in the manager's permissions), is excused.
func knownFalseWarning(msg string, eventsRule int) bool {
	return strings.Contains(msg, "deprecated and removed in v1.25") &&
		strings.HasSuffix(msg, fmt.Sprintf(`Migrate the API(s) for events: (["ClusterServiceVersion.Spec.InstallStrategy.StrategySpec.Permissions[0].Rules[%d]"])`, eventsRule))
}

// eventsRuleIndex is where the manager's permissions grant events.k8s.io.
func eventsRuleIndex(t *testing.T, b *manifests.Bundle) int {
	t.Helper()
	spec := b.CSV.Spec.InstallStrategy.StrategySpec
	require.NotEmpty(t, spec.Permissions)
	for i, r := range spec.Permissions[0].Rules {
		if slices.Contains(r.APIGroups, "events.k8s.io") {
			return i
		}
	}
	require.Fail(t, "the manager's permissions have no events.k8s.io rule")
	return -1
}

// TestBundleSupportsEveryInstallMode: OLM may install the operator for its
// own namespace, one other, several, or all; the Deployment follows the
// target namespaces OLM annotates on its pod.
func TestBundleSupportsEveryInstallMode(t *testing.T) {
	csv := loadBundle(t).CSV
	var supported []string
	for _, m := range csv.Spec.InstallModes {
		if m.Supported {
			supported = append(supported, string(m.Type))
		}
	}
	assert.ElementsMatch(t, []string{"OwnNamespace", "SingleNamespace", "MultiNamespace", "AllNamespaces"}, supported)

	spec := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec
	var watch *corev1.EnvVar
	for i, e := range spec.Containers[0].Env {
		if e.Name == "WATCH_NAMESPACE" {
			watch = &spec.Containers[0].Env[i]
		}
	}
	require.NotNil(t, watch, "the operator reads its target namespaces from WATCH_NAMESPACE")
	require.NotNil(t, watch.ValueFrom)
	require.NotNil(t, watch.ValueFrom.FieldRef)
	assert.Equal(t, "metadata.annotations['olm.targetNamespaces']", watch.ValueFrom.FieldRef.FieldPath)
}

// TestBundleCRDPassesTheAPIServersValidation runs the CRD through
// apiextensions' own validator, after the defaulting the API server applies
// first, and checks the validator is not a no-op on a broken copy.
func TestBundleCRDPassesTheAPIServersValidation(t *testing.T) {
	validate := func(crd *apiextensionsv1.CustomResourceDefinition) []string {
		crd = crd.DeepCopy()
		apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(crd)
		var internal apiextensions.CustomResourceDefinition
		require.NoError(t, apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, &internal, nil))
		var msgs []string
		for _, e := range apiextensionsvalidation.ValidateCustomResourceDefinition(context.Background(), &internal) {
			msgs = append(msgs, e.Error())
		}
		return msgs
	}
	b := loadBundle(t)
	require.Len(t, b.V1CRDs, len(crdFiles), "the bundle ships every CRD")
	for _, crd := range b.V1CRDs {
		assert.Empty(t, validate(crd), crd.Name)
	}

	broken := b.V1CRDs[0].DeepCopy()
	broken.Spec.Versions[0].Storage = false
	broken.Spec.Names.Plural = "Proxies"
	got := strings.Join(validate(broken), "; ")
	assert.Contains(t, got, "must have exactly one version marked as storage version")
	assert.Contains(t, got, "spec.names.plural")
}

// TestBundleOwnsWhatItShips: the CSV owns exactly the bundled CRDs, and
// every descriptor points at a field the CRD has.
func TestBundleOwnsWhatItShips(t *testing.T) {
	b := loadBundle(t)
	var shipped, owned []string
	for _, crd := range b.V1CRDs {
		for _, v := range crd.Spec.Versions {
			shipped = append(shipped, crd.Name+"/"+v.Name+"/"+crd.Spec.Names.Kind)
		}
	}
	for _, o := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		owned = append(owned, o.Name+"/"+o.Version+"/"+o.Kind)
		assert.NotEmpty(t, o.DisplayName, o.Name)
		assert.NotEmpty(t, o.Description, o.Name)
	}
	assert.ElementsMatch(t, shipped, owned)

	crds := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range b.V1CRDs {
		crds[crd.Name] = crd
	}
	for _, owner := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		crd, ok := crds[owner.Name]
		require.True(t, ok, "the CSV owns %s, which the bundle does not ship", owner.Name)
		schema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties
		for root, descriptors := range map[string][]string{
			"spec":   descriptorPaths(owner.SpecDescriptors),
			"status": statusPaths(owner.StatusDescriptors),
		} {
			if _, hasRoot := schema[root]; !hasRoot {
				assert.Empty(t, descriptors, "%s has no %s, so no %s descriptors", owner.Kind, root, root)
				continue
			}
			require.NotEmpty(t, descriptors, "%s %s descriptors", owner.Kind, root)
			for _, path := range descriptors {
				props := schema[root].Properties
				for i, part := range strings.Split(path, ".") {
					p, ok := props[part]
					require.True(t, ok, "%s descriptor %s.%s: the CRD has no field %q", owner.Kind, root, path, strings.Join(strings.Split(path, ".")[:i+1], "."))
					props = p.Properties
				}
			}
		}
	}
}

func descriptorPaths(ds []operatorsv1alpha1.SpecDescriptor) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Path)
	}
	return out
}

func statusPaths(ds []operatorsv1alpha1.StatusDescriptor) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Path)
	}
	return out
}

// TestBundleALMExamples: alm-examples parse, are of owned kinds, and are the
// samples in config/samples (which the API tests apply to a real server).
func TestBundleALMExamples(t *testing.T) {
	b := loadBundle(t)
	var examples []map[string]any
	require.NoError(t, json.Unmarshal([]byte(b.CSV.Annotations["alm-examples"]), &examples))
	owned := map[string]bool{}
	for _, o := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		group := strings.SplitN(o.Name, ".", 2)[1]
		owned[group+"/"+o.Version+"/"+o.Kind] = true
	}
	var names []string
	for _, ex := range examples {
		key := ex["apiVersion"].(string) + "/" + ex["kind"].(string)
		assert.True(t, owned[key], "alm-example of %s, which the CSV does not own", key)
		names = append(names, ex["metadata"].(map[string]any)["name"].(string))
	}
	var samples []string
	for _, f := range []string{"proxy_external.yaml", "proxy_gcp.yaml", "proxy_kubernetes.yaml", "proxypool_kubernetes.yaml", "proxypool_gcp.yaml", "crawltarget.yaml", "tenantquota.yaml"} {
		for _, u := range parseManifests(t, repoFile(t, "config/samples/"+f)) {
			if u.GetKind() == "Proxy" || u.GetKind() == "ProxyPool" || u.GetKind() == "CrawlTarget" || u.GetKind() == "TenantQuota" {
				samples = append(samples, u.GetName())
			}
		}
	}
	assert.ElementsMatch(t, samples, names)
}

// TestBundleIdentity: the CSV is named <package>.v<semver>, its version is
// the chart's appVersion, its image is the chart's default, and it is
// installable the way the operator works (cluster-wide).
func TestBundleIdentity(t *testing.T) {
	b := loadBundle(t)
	csv := b.CSV
	m := regexp.MustCompile(`^` + packageName + `\.v(.+)$`).FindStringSubmatch(csv.Name)
	require.NotNil(t, m, "CSV name %q is not %s.v<semver>", csv.Name, packageName)
	v, err := semver.Parse(m[1])
	require.NoError(t, err, "CSV name %q", csv.Name)
	assert.Equal(t, v, csv.Spec.Version.Version, "spec.version matches the name")

	var chart struct {
		AppVersion  string `json:"appVersion"`
		KubeVersion string `json:"kubeVersion"`
	}
	require.NoError(t, yaml.Unmarshal(repoFile(t, chartDir+"/Chart.yaml"), &chart))
	assert.Equal(t, chart.AppVersion, v.String(), "the chart and the bundle release the same operator")
	assert.Equal(t, ">="+csv.Spec.MinKubeVersion+"-0", chart.KubeVersion, "the same minimum Kubernetes")
	makeVersion := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindSubmatch(repoFile(t, "Makefile"))
	require.NotNil(t, makeVersion)
	assert.Equal(t, string(makeVersion[1]), v.String(), "the Makefile's VERSION")

	modes := map[operatorsv1alpha1.InstallModeType]bool{}
	for _, im := range csv.Spec.InstallModes {
		modes[im.Type] = im.Supported
	}
	assert.Len(t, modes, 4, "all four install modes are stated")
	assert.True(t, modes[operatorsv1alpha1.InstallModeTypeAllNamespaces], "the operator watches Proxies cluster-wide")

	var deploy appsv1.Deployment
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "Deployment", &deploy))
	image := deploy.Spec.Template.Spec.Containers[0].Image
	assert.Equal(t, image, csv.Annotations["containerImage"])
	assert.Equal(t, []operatorsv1alpha1.RelatedImage{{Name: "manager", Image: image}}, csv.Spec.RelatedImages)
	require.Len(t, csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs, 1)
	assert.Equal(t, image, csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0].Image)
	require.Len(t, csv.Spec.Icon, 1)
	assert.Equal(t, "image/svg+xml", csv.Spec.Icon[0].MediaType)
	assert.NotEmpty(t, csv.Spec.Maintainers)
	assert.NotEmpty(t, csv.Spec.Links)
	assert.Equal(t, "false", csv.Annotations["features.operators.openshift.io/disconnected"], "OpenShift feature annotations are stated")
}

// TestBundleDeploymentIsTheKustomizeOne: OLM runs the pod the kustomize
// base runs, with the release image.
func TestBundleDeploymentIsTheKustomizeOne(t *testing.T) {
	var want appsv1.Deployment
	require.True(t, build(t, "config/default").one(t, "Deployment", &want))
	got := loadBundle(t).CSV.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0]
	assert.Equal(t, want.Name, got.Name)
	assert.Empty(t, restrictedViolations(got.Spec.Template.Spec), "the CSV's pod must pass restricted-v2")
	want.Spec.Template.Spec.Containers[0].Image = got.Spec.Template.Spec.Containers[0].Image
	assert.Equal(t, want.Spec, got.Spec)
}

// TestBundleDockerfileLabelsAreTheAnnotations: an image built from
// bundle.Dockerfile says what metadata/annotations.yaml says.
func TestBundleDockerfileLabelsAreTheAnnotations(t *testing.T) {
	var meta struct {
		Annotations map[string]string `json:"annotations"`
	}
	require.NoError(t, yaml.UnmarshalStrict(repoFile(t, bundleDir+"/metadata/annotations.yaml"), &meta))
	labels := map[string]string{}
	var copies []string
	for _, line := range strings.Split(string(repoFile(t, "bundle.Dockerfile")), "\n") {
		if kv, ok := strings.CutPrefix(line, "LABEL "); ok {
			k, v, found := strings.Cut(kv, "=")
			require.True(t, found, "LABEL %q", kv)
			labels[k] = v
		}
		if c, ok := strings.CutPrefix(line, "COPY "); ok {
			copies = append(copies, c)
		}
	}
	assert.Equal(t, meta.Annotations, labels)
	assert.Equal(t, "registry+v1", labels["operators.operatorframework.io.bundle.mediatype.v1"])
	assert.Equal(t, packageName, labels["operators.operatorframework.io.bundle.package.v1"])
	assert.True(t, slices.Contains(strings.Split(labels["operators.operatorframework.io.bundle.channels.v1"], ","), labels["operators.operatorframework.io.bundle.channel.default.v1"]))
	assert.ElementsMatch(t, []string{
		bundleDir + "/manifests /" + labels["operators.operatorframework.io.bundle.manifests.v1"],
		bundleDir + "/metadata /" + labels["operators.operatorframework.io.bundle.metadata.v1"],
	}, copies, "the image holds the directories the labels name")
}
