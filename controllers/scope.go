package controllers

import "slices"

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
