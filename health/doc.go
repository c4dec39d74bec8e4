// Package health probes every proxy through a real CONNECT tunnel and keeps
// the verdicts, writing a Proxy's status only when its verdict changes and
// telling the reconciler of every change. It must never create, replace or
// delete instances, nor import the controllers, the providers or discovery
// (depguard enforces it): replacing a sick proxy is the controller's.
package health
