// Package manifests tests what users install, offline and through the
// tools' own libraries: the kustomize base and overlays (krusty), the Helm
// chart (helm's install and lint actions) and the OLM bundle (the operator
// framework's validators). All three must describe the same operator.
package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestOverlays(t *testing.T) {
	for _, tc := range []struct {
		dir, provider string
		gcp           bool
		role          string // the IRSA role, on AWS
	}{
		{"config/default", "kind-local", false, ""},
		{"overlays/kind", "kind-local", false, ""},
		{"overlays/gcp-eu", "gcp-eu", true, ""},
		{"overlays/gcp-us", "gcp-us", true, ""},
		{"overlays/aws-eu", "aws-eu", false, "arn:aws:iam::111122223333:role/egress-proxies-operator"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			m := build(t, tc.dir)

			var deploy appsv1.Deployment
			require.True(t, m.one(t, "Deployment", &deploy))
			assert.Empty(t, restrictedViolations(deploy.Spec.Template.Spec), "the manager pod must pass Pod Security restricted and OpenShift restricted-v2")

			var cm corev1.ConfigMap
			require.True(t, m.one(t, "ConfigMap", &cm))
			assert.Equal(t, []string{tc.provider}, providerNames(t, cm), "the overlay's providers")
			assert.Contains(t, configMapVolumes(deploy), cm.Name, "the Deployment mounts the generated ConfigMap, so a config change rolls it")
			assert.Regexp(t, `^egress-proxies-operator-providers-config-[a-z0-9]+$`, cm.Name, "a content hash in the name")

			var sa corev1.ServiceAccount
			require.True(t, m.one(t, "ServiceAccount", &sa))
			assert.Equal(t, deploy.Spec.Template.Spec.ServiceAccountName, sa.Name)
			gsa := sa.Annotations["iam.gke.io/gcp-service-account"]
			assert.Equal(t, tc.role, sa.Annotations["eks.amazonaws.com/role-arn"], "the IRSA annotation")
			var binding struct {
				Spec struct {
					Member      string `json:"member"`
					Role        string `json:"role"`
					ResourceRef struct {
						Kind     string `json:"kind"`
						External string `json:"external"`
					} `json:"resourceRef"`
				} `json:"spec"`
			}
			hasBinding := m.one(t, "IAMPolicyMember", &binding)
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
