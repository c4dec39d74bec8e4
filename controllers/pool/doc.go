// Package pool reconciles ProxyPools: it keeps a pool's members (Proxies it
// owns) at the pool's size, spread over its zones, and replaces the outdated,
// the too old and the long-Unhealthy ones as a rolling update under one
// disruption budget; with autoscaling it also sizes the pool from the
// discovery API's demand.
//
// Its decisions are pure functions (decide, recommend) of the pool, its
// members and the clock; the reconciler around them only reads and writes
// Proxies. It never talks to a provider (the Proxy reconciler provisions
// every member), never imports the health engine or discovery (demand
// arrives through its DemandSource interface), and never imports the Proxy
// reconciler's package: depguard enforces all three.
package pool
