// Package shard divides the operator's per-proxy work among its replicas.
// Each replica holds a coordination.k8s.io Lease of its own while it lives;
// every replica lists the group's Leases, and a key belongs to the live
// replica that wins its rendezvous hash, so a replica that joins or leaves
// moves only its own share. A replica drops what it loses at once and takes
// up what another live replica held only after a handover delay, long
// enough for every other replica to have seen the same change: no key has
// two owners at once. A replica that cannot renew its Lease owns nothing
// from its renew deadline, before the others see its Lease expire and take
// its share at once.
//
// It must never import the operator's components (controllers, health,
// discovery, gateway): they are what it divides work among.
package shard
