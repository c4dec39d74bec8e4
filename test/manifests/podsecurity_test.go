package manifests

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

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
