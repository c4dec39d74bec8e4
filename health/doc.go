// Package health probes every proxy through a real CONNECT tunnel and keeps
// the verdicts, writing a Proxy's status only when its verdict changes and
// telling the reconciler of every change. On the reconciler's request it
// also probes a new address before the status names it (ProbeAhead), so
// the address and its first verdict are recorded in one write. It must
// never create, replace or delete instances, nor import the controllers,
// the providers or discovery (depguard enforces it): replacing a sick proxy
// is the controller's.
package health
