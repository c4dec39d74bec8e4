// Package lease is the fleet's lease state: the Store interface and its
// types (leases, cooldowns, gateway sessions' routes, paces, quotas'
// rates and counts, refused requests), the memory backend, the outcome
// memory (what each host did to each proxy, burned IPs) and the ledger's
// records. Every rule about who gets which proxy is decided above it, by
// its callers; it keeps what they decided, atomically, on its own clock.
//
// It sits below everything that uses it (the discovery API, the gateway,
// the ban judge, the reconciler's burned-IP check, the canaries), so it
// must never import any of them, the controllers, the providers, health or
// the Kubernetes API (depguard enforces it). Its Redis backend is
// lease/redisstore, the conformance suite every backend passes
// lease/storetest, and the choice of backend with its flags
// lease/leasestore.
package lease
