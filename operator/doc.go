// Package operator is who a running operator is, in one place: the cluster
// id and operator id labelled on every instance it creates, the namespace
// and release name it runs under, the namespaces it keeps to (Scope), and
// how its manager runs (ManagerOptions), with the flags and the
// downward-API conventions (OLM's WATCH_NAMESPACE and OPERATOR_NAME,
// POD_NAMESPACE) that set them. Each component's own settings are its
// package's options type; main composes them.
//
// It must never import the operator's components (controllers, health,
// discovery, gateway): they are what it describes.
package operator

// MetricsNamespace is the prefix of every metric the operator exports
// (proxy_operator_*): each component's metrics name it as their
// prometheus Namespace, with their own Subsystem.
const MetricsNamespace = "proxy_operator"
