// Package health probes every proxy through a real CONNECT tunnel and keeps
// the verdicts, writing a Proxy's status only when its verdict changes. It
// must never create, replace or delete instances: that is the controller's.
package health
