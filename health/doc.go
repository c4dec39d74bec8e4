// Package health probes every proxy through a real CONNECT tunnel and keeps
// the verdicts. It is the only writer of a Proxy's Healthy and Ready
// conditions, lastHealthCheckTime and healthCheckedInstance, which it
// applies (server-side apply, its own field manager) only when what it
// knows differs from what the status says, and it tells the reconciler of
// every verdict change. It must never create, replace or delete instances,
// nor import the controllers, the providers or discovery (depguard
// enforces it): replacing a sick proxy is the controller's.
package health
