// Package controllers reconciles Proxies: it decides, from a Proxy, what its
// provider reports and what the health engine knows, the one action to take
// next, and takes it; and it heals the fleet (the instance watcher, the
// replacement of lost and long-Unhealthy instances, orphan GC). It talks to
// providers only through the providers package's interface and to the
// health engine only through its own HealthSignals interface: it must never
// import a concrete provider, the health engine or discovery (depguard
// enforces it).
package controllers
