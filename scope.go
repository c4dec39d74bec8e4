package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/controllers"
)

// Where an operator learns who it is and what it keeps to, beside its flags:
// the conventions OLM and the chart fill in through the downward API.
const (
	// envWatchNamespace is OLM's convention: the operator group's target
	// namespaces, comma-separated ("" for all namespaces).
	envWatchNamespace = "WATCH_NAMESPACE"
	// envOperatorName is the release's name (OLM's OPERATOR_NAME
	// convention; the chart sets its full name).
	envOperatorName = "OPERATOR_NAME"
	// defaultOperatorName is the name when nobody says otherwise: the
	// kustomize base's and the bundle's deployment.
	defaultOperatorName = "egress-proxies-operator"
)

// operatorName is the release's name: $OPERATOR_NAME, or the name the
// kustomize base and the bundle deploy under.
func operatorName() string {
	if name := os.Getenv(envOperatorName); name != "" {
		return name
	}
	return defaultOperatorName
}

// defaultWatchNamespaces is $WATCH_NAMESPACE, for the --watch-namespaces
// flag's default.
func defaultWatchNamespaces() string { return os.Getenv(envWatchNamespace) }

// parseScope reads a comma-separated namespace list ("" or only commas and
// spaces: the whole cluster). Every entry must be a namespace name.
func parseScope(list string) (controllers.Scope, error) {
	var namespaces []string
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return controllers.Scope{}, fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	return controllers.Scope{Namespaces: slices.Compact(namespaces)}, nil
}

// scopedCache limits a cache's options to scope, plus the extra namespaces
// the operator keeps its own objects in. The whole cluster leaves them as
// they are.
func scopedCache(opts cache.Options, scope controllers.Scope, extra ...string) cache.Options {
	if scope.Cluster() {
		return opts
	}
	opts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range append(slices.Clone(scope.Namespaces), extra...) {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	return opts
}

// defaultClusterID is what tells this cluster apart when --cluster-id is
// not set: the UID of the kube-system namespace for an operator that
// watches the whole cluster; for one kept to namespaces, whose RBAC reaches
// nothing outside them, the UID of its own namespace (which a Role there
// may read). Both are stable for the namespace's life and distinct between
// clusters; set --cluster-id to keep instances through a change of scope.
func defaultClusterID(ctx context.Context, reader client.Reader, scope controllers.Scope, ownNamespace string) (string, error) {
	name := metav1.NamespaceSystem
	if !scope.Cluster() {
		name = ownNamespace
	}
	var ns corev1.Namespace
	if err := reader.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
		return "", fmt.Errorf("reading the namespace %s for the default --cluster-id (set --cluster-id to skip): %w", name, err)
	}
	return string(ns.UID), nil
}

// scopeForLog says what the operator watches, for its start line.
func scopeForLog(scope controllers.Scope) any {
	if scope.Cluster() {
		return "all"
	}
	return scope.Namespaces
}
