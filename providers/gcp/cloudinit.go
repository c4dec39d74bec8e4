package gcp

import (
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// DeniedDestinations are never reachable through a VM's Squid
// (squidconf.VMDeniedDestinations).
var DeniedDestinations = squidconf.VMDeniedDestinations

// vmStagingDir is where the hardened cloud-init stages its files.
const vmStagingDir = squidconf.VMStagingDir

// Instance metadata keys holding the proxy's lease key (this proxy's own,
// never the provider's password) and the lease-auth helper: a user's own
// cloud-init reads them from the metadata server to check the same
// per-lease credentials.
const (
	leaseKeyMetadataKey  = "egress-proxy-lease-key"
	leaseAuthMetadataKey = "egress-proxy-lease-auth"
)

// cloudConfig is the cloud-config the operator writes.
type cloudConfig = squidconf.CloudConfig

// renderCloudInit is the user-data of a VM whose Proxy brings none
// (squidconf.VMCloudInit), with the source ranges of the provider's
// firewall.
func (p *Provider) renderCloudInit(req providers.CreateRequest, leaseKey string) (string, error) {
	doc, err := squidconf.VMCloudInit(squidconf.VMParams{
		Owner: req.Proxy.Namespace + "/" + req.Proxy.Name, Port: req.Proxy.Spec.Port,
		AllowedSources: p.settings.Firewall.SourceRanges, LeaseKey: leaseKey,
	})
	if err != nil {
		return "", providers.Terminal("%v", err)
	}
	return doc, nil
}
