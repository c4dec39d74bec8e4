package operator

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// Scope is the set of namespaces an operator keeps to: its caches, watches,
// discovery view and GC. The zero Scope is the whole cluster.
type Scope struct {
	// Namespaces, sorted and unique; empty means every namespace.
	Namespaces []string
}

// Cluster tells whether the scope is the whole cluster.
func (s Scope) Cluster() bool { return len(s.Namespaces) == 0 }

// Contains tells whether objects in namespace are the operator's to act on.
func (s Scope) Contains(namespace string) bool {
	return s.Cluster() || slices.Contains(s.Namespaces, namespace)
}

// String says what the operator keeps to, for its start line.
func (s Scope) String() string {
	if s.Cluster() {
		return "all"
	}
	return strings.Join(s.Namespaces, ",")
}

// ParseScope reads a comma-separated namespace list ("" or only commas and
// spaces: the whole cluster). Every entry must be a namespace name.
func ParseScope(list string) (Scope, error) {
	var namespaces []string
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return Scope{}, fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	return Scope{Namespaces: slices.Compact(namespaces)}, nil
}

// Cache limits a cache's options to the scope, plus the extra namespaces
// the operator keeps its own objects in. The whole cluster leaves them as
// they are.
func (s Scope) Cache(opts cache.Options, extra ...string) cache.Options {
	if s.Cluster() {
		return opts
	}
	opts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range append(slices.Clone(s.Namespaces), extra...) {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	return opts
}
