// Package manifests tests the shipped kustomize base and overlays offline,
// through kustomize's own library: what each overlay would apply, checked
// for the properties users rely on.
package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func build(t *testing.T, dir string) resmap.ResMap {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), dir))
	require.NoError(t, err, "kustomize build %s", dir)
	return m
}

// only decodes the single resource of kind into out.
func only(t *testing.T, m resmap.ResMap, kind string, out any) bool {
	t.Helper()
	var found []string
	for _, r := range m.Resources() {
		if r.GetKind() == kind {
			data, err := r.AsYAML()
			require.NoError(t, err)
			found = append(found, string(data))
		}
	}
	if len(found) == 0 {
		return false
	}
	require.Len(t, found, 1, "want one %s", kind)
	require.NoError(t, yaml.Unmarshal([]byte(found[0]), out))
	return true
}

func TestOverlays(t *testing.T) {
	for _, tc := range []struct {
		dir, provider string
		gcp           bool
	}{
		{"config/default", "kind-local", false},
		{"overlays/kind", "kind-local", false},
		{"overlays/gcp-eu", "gcp-eu", true},
		{"overlays/gcp-us", "gcp-us", true},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			m := build(t, tc.dir)

			var deploy appsv1.Deployment
			require.True(t, only(t, m, "Deployment", &deploy))
			assert.Empty(t, restrictedViolations(deploy.Spec.Template.Spec), "the manager pod must pass Pod Security restricted and OpenShift restricted-v2")

			var cm corev1.ConfigMap
			require.True(t, only(t, m, "ConfigMap", &cm))
			cfg, err := providers.ParseConfig([]byte(cm.Data["providers.yaml"]))
			require.NoError(t, err)
			assert.Equal(t, []string{tc.provider}, cfg.Names(), "the overlay's providers")
			assert.Contains(t, configMapVolumes(deploy), cm.Name, "the Deployment mounts the generated ConfigMap, so a config change rolls it")
			assert.Regexp(t, `^egress-proxies-operator-providers-config-[a-z0-9]+$`, cm.Name, "a content hash in the name")

			var sa corev1.ServiceAccount
			require.True(t, only(t, m, "ServiceAccount", &sa))
			assert.Equal(t, deploy.Spec.Template.Spec.ServiceAccountName, sa.Name)
			gsa := sa.Annotations["iam.gke.io/gcp-service-account"]
			var binding struct {
				Spec struct {
					Member, Role string
					ResourceRef  struct{ Kind, External string } `json:"resourceRef"`
				}
			}
			hasBinding := only(t, m, "IAMPolicyMember", &binding)
			if !tc.gcp {
				assert.Empty(t, gsa, "no Workload Identity outside GCP")
				assert.False(t, hasBinding, "no IAMPolicyMember outside GCP")
				return
			}
			require.True(t, hasBinding)
			require.NotEmpty(t, gsa)
			project := regexp.MustCompile(`@([a-z0-9-]+)\.iam\.gserviceaccount\.com$`).FindStringSubmatch(gsa)
			require.NotNil(t, project, "GSA email %q", gsa)
			want := "serviceAccount:" + project[1] + ".svc.id.goog[" + sa.Namespace + "/" + sa.Name + "]"
			assert.Equal(t, want, binding.Spec.Member, "the binding names the namespace and ServiceAccount the overlay deploys")
			assert.Equal(t, "roles/iam.workloadIdentityUser", binding.Spec.Role)
			assert.Equal(t, "projects/"+project[1]+"/serviceAccounts/"+gsa, binding.Spec.ResourceRef.External)
		})
	}
}

// TestCRDIsTheGeneratedOne: what the overlays apply is config/crd/bases,
// byte for byte once parsed.
func TestCRDIsTheGeneratedOne(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config/crd/bases/crawl.example.com_proxies.yaml"))
	require.NoError(t, err)
	var want, got apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.Unmarshal(data, &want))
	for _, dir := range []string{"overlays/kind", "overlays/gcp-eu", "overlays/gcp-us"} {
		require.True(t, only(t, build(t, dir), "CustomResourceDefinition", &got))
		assert.Equal(t, want.Spec, got.Spec, dir)
	}
}

// TestNoDeprecatedKustomizeFields keeps to labels/patches/replacements.
func TestNoDeprecatedKustomizeFields(t *testing.T) {
	deprecated := []string{"commonLabels:", "patchesStrategicMerge:", "patchesJson6902:", "bases:", "vars:", "imageTags:"}
	root := testenv.RepoRoot()
	var files []string
	for _, dir := range []string{"config", "overlays"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.Name() == "kustomization.yaml" {
				files = append(files, path)
			}
			return err
		}))
	}
	require.NotEmpty(t, files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, field := range deprecated {
			assert.NotContains(t, string(data), "\n"+field, "%s uses the deprecated %s", f, field)
		}
	}
}

func configMapVolumes(d appsv1.Deployment) []string {
	var names []string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			names = append(names, v.ConfigMap.Name)
		}
	}
	return names
}

// restrictedViolations checks a pod spec against Pod Security "restricted"
// and OpenShift's restricted-v2 (which also forbids a fixed runAsUser, since
// it assigns one from the namespace's range).
func restrictedViolations(spec corev1.PodSpec) []string {
	var v []string
	psc := spec.SecurityContext
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		v = append(v, "host namespaces")
	}
	for _, vol := range spec.Volumes {
		if vol.HostPath != nil {
			v = append(v, "hostPath volume "+vol.Name)
		}
	}
	if psc != nil && psc.RunAsUser != nil {
		v = append(v, "a fixed pod runAsUser (restricted-v2 assigns one)")
	}
	podSeccomp := psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	podNonRoot := psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		name := "container " + c.Name + ": "
		if sc == nil {
			v = append(v, name+"no securityContext")
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			v = append(v, name+"privileged")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			v = append(v, name+"allowPrivilegeEscalation is not false")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			v = append(v, name+"capabilities do not drop ALL")
		} else if len(sc.Capabilities.Add) > 0 {
			v = append(v, name+"adds capabilities")
		}
		if !podNonRoot && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
			v = append(v, name+"runAsNonRoot is not true")
		}
		if sc.RunAsUser != nil {
			v = append(v, name+"a fixed runAsUser")
		}
		if !podSeccomp && (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
			v = append(v, name+"seccomp is not RuntimeDefault")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			v = append(v, name+"root filesystem is writable")
		}
	}
	return v
}

func TestRestrictedCheckCatchesViolations(t *testing.T) {
	ok := corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "m", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
	}
	assert.Empty(t, restrictedViolations(ok))
	bad := ok.DeepCopy()
	bad.SecurityContext.RunAsUser = ptr[int64](1000)
	bad.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
	bad.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
	got := strings.Join(restrictedViolations(*bad), "; ")
	assert.Contains(t, got, "fixed pod runAsUser")
	assert.Contains(t, got, "allowPrivilegeEscalation")
	assert.Contains(t, got, "adds capabilities")
}

func ptr[T any](v T) *T { return &v }
