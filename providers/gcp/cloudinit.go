package gcp

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// DeniedDestinations are never reachable through a VM's Squid: loopback,
// link-local (the metadata server at 169.254.169.254, whose tokens would be
// the VM's service account), the private and shared ranges of the VPC and
// beyond, in IPv4 and IPv6.
var DeniedDestinations = []string{
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16",
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
	"::1/128", "fe80::/10", "fc00::/7",
}

// Paths of the hardened cloud-init on a Debian or Ubuntu image. Squid's
// package writes its own squid.conf when it installs, so the operator's
// files land in a directory of their own and are installed over it once the
// package is in.
const (
	vmStagingDir  = "/etc/egress-proxy"
	vmSquidConf   = "/etc/squid/squid.conf"
	vmLeaseKey    = "/etc/squid/lease.key"
	vmLeaseAuth   = "/usr/local/lib/egress-proxy/lease-auth.pl"
	vmRevokedFile = "/var/spool/squid/revoked-leases"
)

// Instance metadata keys holding the proxy's lease key (this proxy's own,
// never the provider's password) and the lease-auth helper: a user's own
// cloud-init reads them from the metadata server to check the same
// per-lease credentials.
const (
	leaseKeyMetadataKey  = "egress-proxy-lease-key"
	leaseAuthMetadataKey = "egress-proxy-lease-auth"
)

// cloudConfig is the subset of cloud-config the operator writes.
type cloudConfig struct {
	PackageUpdate bool        `json:"package_update"`
	Packages      []string    `json:"packages"`
	WriteFiles    []writeFile `json:"write_files"`
	Runcmd        [][]string  `json:"runcmd"`
}

type writeFile struct {
	Path        string `json:"path"`
	Permissions string `json:"permissions"`
	Content     string `json:"content"`
}

// renderCloudInit is the user-data of a VM whose Proxy brings none: Squid
// with the credentials and the source ranges of the provider's firewall,
// CONNECT to 443 only and DeniedDestinations refused.
func (p *Provider) renderCloudInit(req providers.CreateRequest, leaseKey string) (string, error) {
	conf, err := squidconf.Render(squidconf.Params{
		Owner:              req.Proxy.Namespace + "/" + req.Proxy.Name,
		Port:               req.Proxy.Spec.Port,
		AllowedSources:     p.settings.Firewall.SourceRanges,
		DeniedDestinations: DeniedDestinations,
		AuthHelper:         vmLeaseAuth,
		KeyFile:            vmLeaseKey,
		RevokedFile:        vmRevokedFile,
	})
	if err != nil {
		return "", providers.Terminal("%v", err)
	}
	doc, err := yaml.Marshal(cloudConfig{
		PackageUpdate: true,
		Packages:      []string{"squid"},
		WriteFiles: []writeFile{
			{Path: vmStagingDir + "/squid.conf", Permissions: "0600", Content: conf},
			{Path: vmStagingDir + "/lease.key", Permissions: "0600", Content: leaseKey},
			{Path: vmStagingDir + "/lease-auth.pl", Permissions: "0600", Content: squidconf.LeaseAuthHelper},
		},
		Runcmd: [][]string{
			{"install", "-o", "root", "-g", "root", "-m", "0644", vmStagingDir + "/squid.conf", vmSquidConf},
			// proxy is Debian's squid user (uid 13), present in every image.
			{"install", "-o", "root", "-g", "proxy", "-m", "0640", vmStagingDir + "/lease.key", vmLeaseKey},
			{"install", "-D", "-o", "root", "-g", "root", "-m", "0755", vmStagingDir + "/lease-auth.pl", vmLeaseAuth},
			{"rm", "-rf", vmStagingDir},
			{"systemctl", "enable", "squid"},
			{"systemctl", "restart", "squid"},
		},
	})
	if err != nil {
		return "", providers.Terminal("encoding the cloud-init of %s: %v", req.Name, err)
	}
	return fmt.Sprintf("#cloud-config\n# Rendered by egress-proxies-operator for Proxy %s/%s: set spec.cloudInit to bring your own.\n%s",
		req.Proxy.Namespace, req.Proxy.Name, strings.TrimPrefix(string(doc), "---\n")), nil
}
