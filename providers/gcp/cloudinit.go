package gcp

import "github.com/example/egress-proxies-operator/providers/squidconf"

// DeniedDestinations are never reachable through a VM's Squid
// (squidconf.VMDeniedDestinations).
var DeniedDestinations = squidconf.VMDeniedDestinations

// vmStagingDir is where the hardened cloud-init stages its files.
const vmStagingDir = squidconf.VMStagingDir

// Instance metadata keys holding where the proxy's lease key is (its
// Secret Manager version, never the key), the script that fetches it with
// the VM's service account, and the lease-auth helper: a user's own
// cloud-init reads them from the metadata server to check the same
// per-lease credentials.
const (
	leaseKeySecretMetadataKey = "egress-proxy-lease-key-secret"
	leaseKeyFetchMetadataKey  = "egress-proxy-lease-key-fetch"
	leaseAuthMetadataKey      = "egress-proxy-lease-auth"
)

// cloudConfig is the cloud-config the operator writes.
type cloudConfig = squidconf.CloudConfig
