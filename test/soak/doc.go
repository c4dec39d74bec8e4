// Package soak runs the whole operator for minutes under faults and load
// (`make soak`) and checks that nothing was lost: every Proxy converges, no
// instance is leaked or duplicated, no lease outlives its TTL, every health
// verdict matches what a probe of our own finds, memory and goroutines stay
// flat, and discovery answers every request with a documented status code.
// docs/reliability.md says what it injects and checks. Its tests carry the
// soak build tag, so `make test` never runs them.
package soak
