// Package tracing sends the operator's OpenTelemetry traces to an OTLP
// endpoint (off unless one is given): one span per gateway tunnel or
// request, per lease, and per reconcile of a Proxy, with the tenant, the
// proxy and the host as attributes, joined to the trace a client's W3C
// traceparent names. It owns the flags, the exporter and the attribute
// keys every component uses, so a trace reads the same wherever it was
// made.
//
// It must never import a component (controllers, health, discovery, the
// gateway, the broker): they import it.
package tracing
