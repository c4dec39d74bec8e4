// Command bundle writes the OLM bundle (bundle/, bundle.Dockerfile) from
// what the kustomize base deploys, so OLM users get the same operator as
// kustomize and Helm users. It is `make bundle`; operator-sdk is not needed.
//
// The CSV is the hand-written base (config/manifests/bases) plus what only
// the manifests know: the Deployment, the RBAC rules its ServiceAccount is
// bound to, the image, the version and the samples. Every object kustomize
// renders must be placed somewhere; an unknown kind is an error, so adding
// one to config/ forces a decision here instead of a silently partial bundle.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/api/pkg/lib/version"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// managedByLabel is kustomize's mark, not true of what OLM installs.
const managedByLabel = "app.kubernetes.io/managed-by"

// Options are the generator's inputs, all paths relative to the repository.
type Options struct {
	Package        string
	Version        string
	Image          string
	Channels       []string
	DefaultChannel string
	// OpenShiftVersions is com.redhat.openshift.versions: the oldest
	// OpenShift whose Kubernetes meets the CSV's minKubeVersion.
	OpenShiftVersions string

	Kustomization string // the kustomize directory the bundle is made from
	BaseCSV       string
	Icon          string
	CRDs          []string // controller-gen's CRDs, copied byte for byte
	Samples       string   // directory of samples; its Proxies, ProxyPools, CrawlTargets and TenantQuotas become alm-examples
	OutDir        string
	Dockerfile    string
}

func main() {
	o := Options{
		Kustomization: "config/default",
		BaseCSV:       "config/manifests/bases/egress-proxies-operator.clusterserviceversion.yaml",
		Icon:          "config/manifests/icon.svg",
		CRDs:          []string{"config/crd/bases/crawl.example.com_proxies.yaml", "config/crd/bases/crawl.example.com_proxypools.yaml", "config/crd/bases/crawl.example.com_crawltargets.yaml", "config/crd/bases/crawl.example.com_tenantquotas.yaml"},
		Samples:       "config/samples",
		OutDir:        "bundle",
		Dockerfile:    "bundle.Dockerfile",
	}
	var channels string
	flag.StringVar(&o.Package, "package", "egress-proxies-operator", "OLM package name.")
	flag.StringVar(&o.Version, "version", "", "Operator version, semver without a leading v (required).")
	flag.StringVar(&o.Image, "image", "", "The manager image the bundle installs (required).")
	flag.StringVar(&channels, "channels", "candidate", "Comma-separated channels.")
	flag.StringVar(&o.DefaultChannel, "default-channel", "candidate", "The default channel.")
	flag.StringVar(&o.OpenShiftVersions, "openshift-versions", "v4.18", "com.redhat.openshift.versions.")
	flag.Parse()
	o.Channels = strings.Split(channels, ",")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
}

func run(o Options) error {
	files, err := Generate(o)
	if err != nil {
		return err
	}
	// Start from an empty bundle so a file no longer generated disappears.
	for _, dir := range []string{"manifests", "metadata"} {
		if err := os.RemoveAll(filepath.Join(o.OutDir, dir)); err != nil {
			return fmt.Errorf("clearing the old bundle: %w", err)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(files)) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.WriteFile(path, files[path], 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}

// Generate returns every file of the bundle by path.
func Generate(o Options) (map[string][]byte, error) {
	if _, err := semver.Parse(o.Version); err != nil {
		return nil, fmt.Errorf("-version %q is not semver (no leading v): %w", o.Version, err)
	}
	if o.Image == "" {
		return nil, errors.New("-image is required")
	}
	if !slices.Contains(o.Channels, o.DefaultChannel) {
		return nil, fmt.Errorf("-default-channel %q is not among -channels %v", o.DefaultChannel, o.Channels)
	}
	objs, err := kustomize(o.Kustomization)
	if err != nil {
		return nil, err
	}
	var csv operatorsv1alpha1.ClusterServiceVersion
	if err := readYAML(o.BaseCSV, &csv); err != nil {
		return nil, err
	}
	icon, err := os.ReadFile(o.Icon)
	if err != nil {
		return nil, fmt.Errorf("reading the icon: %w", err)
	}
	examples, err := almExamples(o.Samples)
	if err != nil {
		return nil, err
	}

	manifests := filepath.Join(o.OutDir, "manifests")
	files := map[string][]byte{}
	for _, path := range o.CRDs {
		crd, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading the CRD: %w", err)
		}
		files[filepath.Join(manifests, filepath.Base(path))] = crd
	}
	strategy, extra, err := place(objs)
	if err != nil {
		return nil, err
	}
	if err := checkOwned(csv, objs); err != nil {
		return nil, err
	}
	for i := range strategy.DeploymentSpecs {
		for j := range strategy.DeploymentSpecs[i].Spec.Template.Spec.Containers {
			c := &strategy.DeploymentSpecs[i].Spec.Template.Spec.Containers[j]
			if c.Name == "manager" {
				c.Image = o.Image
			}
		}
	}

	csv.Name = o.Package + ".v" + o.Version
	csv.Spec.Version = version.OperatorVersion{Version: semver.MustParse(o.Version)}
	csv.Spec.InstallStrategy = operatorsv1alpha1.NamedInstallStrategy{
		StrategyName: operatorsv1alpha1.InstallStrategyNameDeployment,
		StrategySpec: strategy,
	}
	csv.Spec.RelatedImages = []operatorsv1alpha1.RelatedImage{{Name: "manager", Image: o.Image}}
	csv.Spec.Icon = []operatorsv1alpha1.Icon{{Data: base64.StdEncoding.EncodeToString(icon), MediaType: "image/svg+xml"}}
	csv.Annotations["containerImage"] = o.Image
	csv.Annotations["alm-examples"] = examples
	data, err := marshalCSV(csv)
	if err != nil {
		return nil, err
	}
	files[filepath.Join(manifests, o.Package+".clusterserviceversion.yaml")] = data

	for _, u := range extra {
		data, err := yaml.Marshal(u.Object)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		files[filepath.Join(manifests, manifestFileName(u))] = data
	}

	annotations := bundleAnnotations(o)
	data, err = yaml.Marshal(map[string]any{"annotations": annotations})
	if err != nil {
		return nil, err
	}
	files[filepath.Join(o.OutDir, "metadata", "annotations.yaml")] = data
	files[o.Dockerfile] = dockerfile(o, annotations)
	return files, nil
}

// place sorts kustomize's objects into the install strategy (the
// Deployment, and the rules of the roles bound to its ServiceAccount) and
// the extra manifests OLM applies beside the CSV. What OLM creates itself
// (the namespace, the ServiceAccount, the bindings) is dropped.
func place(objs []*unstructured.Unstructured) (operatorsv1alpha1.StrategyDetailsDeployment, []*unstructured.Unstructured, error) {
	var (
		strategy operatorsv1alpha1.StrategyDetailsDeployment
		extra    []*unstructured.Unstructured
		errs     []error
	)
	roles := map[string]*rbacv1.ClusterRole{} // ClusterRoles by name
	nsRoles := map[string]*rbacv1.Role{}
	var clusterBindings []rbacv1.ClusterRoleBinding
	var bindings []rbacv1.RoleBinding
	for _, u := range objs {
		u.SetNamespace("") // OLM installs into the OperatorGroup's namespace
		// OLM manages these objects, not kustomize.
		labels := u.GetLabels()
		delete(labels, managedByLabel)
		u.SetLabels(labels)
		switch u.GetKind() {
		case "Namespace", "ServiceAccount", "CustomResourceDefinition":
			// OLM creates the namespace and the ServiceAccount; the CRD is
			// copied from controller-gen's file.
		case "NetworkPolicy":
			// OLM before operator-registry v1.55 (OpenShift 4.20), and OLM
			// v1, refuse the kind in a bundle; the README says to apply
			// config/default/network_policy.yaml by hand.
		case "Deployment":
			var d appsv1.Deployment
			if err := fromUnstructured(u, &d); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(d.Spec.Template.Labels, managedByLabel)
			strategy.DeploymentSpecs = append(strategy.DeploymentSpecs, operatorsv1alpha1.StrategyDeploymentSpec{
				Name: d.Name, Label: d.Labels, Spec: d.Spec,
			})
		case "ClusterRole":
			var r rbacv1.ClusterRole
			errs = append(errs, fromUnstructured(u, &r))
			roles[r.Name] = &r
		case "Role":
			var r rbacv1.Role
			errs = append(errs, fromUnstructured(u, &r))
			nsRoles[r.Name] = &r
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			errs = append(errs, fromUnstructured(u, &b))
			clusterBindings = append(clusterBindings, b)
		case "RoleBinding":
			var b rbacv1.RoleBinding
			errs = append(errs, fromUnstructured(u, &b))
			bindings = append(bindings, b)
		case "Service", "ConfigMap":
			extra = append(extra, u)
		default:
			errs = append(errs, fmt.Errorf("%s %s: no place in an OLM bundle; handle the kind in hack/bundle", u.GetKind(), u.GetName()))
		}
	}
	bound := map[string]bool{}
	for _, b := range clusterBindings {
		r, ok := roles[b.RoleRef.Name]
		if !ok || b.RoleRef.Kind != "ClusterRole" {
			errs = append(errs, fmt.Errorf("ClusterRoleBinding %s binds %s %s, which is not in the manifests", b.Name, b.RoleRef.Kind, b.RoleRef.Name))
			continue
		}
		bound[r.Name] = true
		namespaced, clusterWide := splitByScope(r.Rules)
		for _, sa := range serviceAccounts(b.Subjects) {
			if len(clusterWide) > 0 {
				strategy.ClusterPermissions = append(strategy.ClusterPermissions, operatorsv1alpha1.StrategyDeploymentPermissions{ServiceAccountName: sa, Rules: clusterWide})
			}
			if len(namespaced) > 0 {
				strategy.Permissions = append(strategy.Permissions, operatorsv1alpha1.StrategyDeploymentPermissions{ServiceAccountName: sa, Rules: namespaced})
			}
		}
	}
	for _, b := range bindings {
		r, ok := nsRoles[b.RoleRef.Name]
		if !ok || b.RoleRef.Kind != "Role" {
			errs = append(errs, fmt.Errorf("RoleBinding %s binds %s %s: only Roles of the manifests can become OLM permissions", b.Name, b.RoleRef.Kind, b.RoleRef.Name))
			continue
		}
		for _, sa := range serviceAccounts(b.Subjects) {
			strategy.Permissions = append(strategy.Permissions, operatorsv1alpha1.StrategyDeploymentPermissions{ServiceAccountName: sa, Rules: r.Rules})
		}
	}
	// ClusterRoles nobody binds (metrics-reader, the aggregated editor and
	// viewer roles) are for users to bind: they ship as they are.
	for _, u := range objs {
		if u.GetKind() == "ClusterRole" && !bound[u.GetName()] {
			extra = append(extra, u)
		}
	}
	if len(strategy.DeploymentSpecs) != 1 {
		errs = append(errs, fmt.Errorf("want one Deployment in the manifests, found %d", len(strategy.DeploymentSpecs)))
	}
	return strategy, extra, errors.Join(errs...)
}

// clusterScoped are the resources of the manager's rules that no Role can
// grant (group/resource). Everything else is namespaced.
var clusterScoped = map[string]bool{
	"authentication.k8s.io/tokenreviews":        true,
	"authorization.k8s.io/subjectaccessreviews": true,
	"/nodes":             true,
	"/persistentvolumes": true,
	"apiextensions.k8s.io/customresourcedefinitions":               true,
	"rbac.authorization.k8s.io/clusterroles":                       true,
	"rbac.authorization.k8s.io/clusterrolebindings":                true,
	"admissionregistration.k8s.io/validatingwebhookconfigurations": true,
}

// splitByScope sorts a bound ClusterRole's rules for OLM. Namespaced rules
// become permissions, which OLM grants in the operator group's target
// namespaces (and cluster-wide in AllNamespaces mode), so an operator
// installed for a few namespaces is granted nothing outside them; the
// cluster-scoped ones (the metrics endpoint's TokenReviews and
// SubjectAccessReviews, which read nothing) stay cluster permissions. The
// namespaces rule is namespaced here: a Role lets the operator read its own
// namespace, whose UID is its default cluster id when scoped.
func splitByScope(rules []rbacv1.PolicyRule) (namespaced, clusterWide []rbacv1.PolicyRule) {
	for _, r := range rules {
		cluster := false
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				cluster = cluster || clusterScoped[g+"/"+res]
			}
		}
		if cluster {
			clusterWide = append(clusterWide, r)
		} else {
			namespaced = append(namespaced, r)
		}
	}
	return namespaced, clusterWide
}

func serviceAccounts(subjects []rbacv1.Subject) []string {
	var out []string
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind {
			out = append(out, s.Name)
		}
	}
	return out
}

// checkOwned insists the base CSV owns exactly the CRDs the manifests
// install, each at its served versions.
func checkOwned(csv operatorsv1alpha1.ClusterServiceVersion, objs []*unstructured.Unstructured) error {
	var want, got []string
	for _, u := range objs {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind")
		versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
		for _, v := range versions {
			name, _, _ := unstructured.NestedString(v.(map[string]any), "name")
			want = append(want, u.GetName()+"/"+name+"/"+kind)
		}
	}
	for _, o := range csv.Spec.CustomResourceDefinitions.Owned {
		got = append(got, o.Name+"/"+o.Version+"/"+o.Kind)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		return fmt.Errorf("the base CSV owns %v but the manifests install %v: update spec.customresourcedefinitions.owned", got, want)
	}
	return nil
}

// almExamples is the JSON list of the sample Proxies, ProxyPools,
// CrawlTargets and TenantQuotas, the objects a catalog offers to create.
func almExamples(dir string) (string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return "", fmt.Errorf("listing samples: %w", err)
	}
	slices.Sort(paths)
	var examples []map[string]any
	for _, path := range paths {
		objs, err := readObjects(path)
		if err != nil {
			return "", err
		}
		for _, u := range objs {
			switch u.GetKind() {
			case "Proxy", "ProxyPool", "CrawlTarget", "TenantQuota":
				examples = append(examples, u.Object)
			}
		}
	}
	if len(examples) == 0 {
		return "", fmt.Errorf("no Proxy among the samples in %s", dir)
	}
	data, err := json.MarshalIndent(examples, "", "  ")
	if err != nil {
		return "", fmt.Errorf("alm-examples: %w", err)
	}
	return string(data), nil
}

// bundleAnnotations are metadata/annotations.yaml; bundle.Dockerfile
// carries the same as labels.
func bundleAnnotations(o Options) map[string]string {
	return map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1":       "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1":       "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":        "metadata/",
		"operators.operatorframework.io.bundle.package.v1":         o.Package,
		"operators.operatorframework.io.bundle.channels.v1":        strings.Join(o.Channels, ","),
		"operators.operatorframework.io.bundle.channel.default.v1": o.DefaultChannel,
		"com.redhat.openshift.versions":                            o.OpenShiftVersions,
	}
}

func dockerfile(o Options, annotations map[string]string) []byte {
	var b bytes.Buffer
	b.WriteString("# The OLM bundle image: written by `make bundle` (hack/bundle); edit the\n# generator, not this file. Its labels are bundle/metadata/annotations.yaml.\n")
	b.WriteString("FROM scratch\n\n")
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		fmt.Fprintf(&b, "LABEL %s=%s\n", k, annotations[k])
	}
	fmt.Fprintf(&b, "\nCOPY %s/manifests /manifests/\nCOPY %s/metadata /metadata/\n", o.OutDir, o.OutDir)
	return b.Bytes()
}

// marshalCSV writes the CSV without the status, zero timestamps and empty
// sections that the Go types would otherwise spell out.
func marshalCSV(csv operatorsv1alpha1.ClusterServiceVersion) ([]byte, error) {
	csv.APIVersion = operatorsv1alpha1.SchemeGroupVersion.String()
	csv.Kind = operatorsv1alpha1.ClusterServiceVersionKind
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&csv)
	if err != nil {
		return nil, fmt.Errorf("the CSV: %w", err)
	}
	delete(obj, "status")
	unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
	if len(csv.Spec.APIServiceDefinitions.Owned)+len(csv.Spec.APIServiceDefinitions.Required) == 0 {
		unstructured.RemoveNestedField(obj, "spec", "apiservicedefinitions")
	}
	if !csv.Spec.Cleanup.Enabled {
		unstructured.RemoveNestedField(obj, "spec", "cleanup")
	}
	deployments, _, _ := unstructured.NestedSlice(obj, "spec", "install", "spec", "deployments")
	for _, d := range deployments {
		unstructured.RemoveNestedField(d.(map[string]any), "spec", "template", "metadata", "creationTimestamp")
	}
	if err := unstructured.SetNestedSlice(obj, deployments, "spec", "install", "spec", "deployments"); err != nil {
		return nil, fmt.Errorf("the CSV: %w", err)
	}
	data, err := yaml.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("the CSV: %w", err)
	}
	return data, nil
}

// manifestFileName follows operator-sdk's <name>_<group>_<version>_<kind>.yaml.
func manifestFileName(u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	parts := []string{u.GetName()}
	if gvk.Group != "" {
		parts = append(parts, gvk.Group)
	}
	parts = append(parts, gvk.Version, strings.ToLower(gvk.Kind))
	return strings.Join(parts, "_") + ".yaml"
}
