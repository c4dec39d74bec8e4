package squidconf

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// VMDeniedDestinations are never reachable through a VM's Squid, on any
// cloud: loopback, link-local (the metadata servers at 169.254.169.254,
// whose tokens would be the VM's own identity), the private and shared
// ranges of the VPC and beyond, in IPv4 and IPv6.
var VMDeniedDestinations = []string{
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16",
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
	"::1/128", "fe80::/10", "fc00::/7",
}

// Paths of the hardened cloud-init on a Debian or Ubuntu image. Squid's
// package writes its own squid.conf when it installs, so the operator's
// files land in a directory of their own and are installed over it once the
// package is in.
const (
	VMStagingDir  = "/etc/egress-proxy"
	VMSquidConf   = "/etc/squid/squid.conf"
	VMLeaseKey    = "/etc/squid/lease.key"
	VMLeaseAuth   = "/usr/local/lib/egress-proxy/lease-auth.pl"
	VMRevokedFile = "/var/spool/squid/revoked-leases"
)

// CloudConfig is the subset of cloud-config the operator writes.
type CloudConfig struct {
	PackageUpdate bool        `json:"package_update"`
	Packages      []string    `json:"packages"`
	WriteFiles    []WriteFile `json:"write_files"`
	Runcmd        [][]string  `json:"runcmd"`
}

// WriteFile is one of a CloudConfig's files.
type WriteFile struct {
	Path        string `json:"path"`
	Permissions string `json:"permissions"`
	Content     string `json:"content"`
}

// VMParams are what a VM's cloud-init needs.
type VMParams struct {
	// Owner is the Proxy's namespace/name; Port its spec.port.
	Owner string
	Port  int32
	// AllowedSources are the provider's firewall source ranges.
	AllowedSources []string
	// LeaseKey is where the VM fetches its own lease key at boot (never
	// the password, and never the key itself: user-data is readable by
	// whoever may describe the VM).
	LeaseKey LeaseKeySource
	// IPv6, when set, has Squid leave from addresses of the VM's IPv6
	// range, one per gateway session (SessionAddressScript finds the
	// range at boot: from LeaseKey.Cloud's metadata server, of
	// IPv6PrefixLength when the metadata does not say).
	IPv6             *IPv6Egress
	IPv6PrefixLength int
}

// VMUserData is a VM's user-data: own, the Proxy's own cloud-init, when
// it brings one, else the hardened VMCloudInit of p.
func VMUserData(own string, p VMParams) (string, error) {
	if own != "" {
		return own, nil
	}
	return VMCloudInit(p)
}

// VMCloudInit is the user-data of a VM whose Proxy brings none, on any
// cloud: Squid with the per-lease credentials check and the source ranges
// of the provider's firewall, CONNECT to 443 only and VMDeniedDestinations
// refused; the lease key is fetched at boot with the VM's own identity
// (LeaseKeyFetcher), and Squid is only enabled once it is there. Errors are
// the parameters' (a bad range), for the Proxy's status.
func VMCloudInit(p VMParams) (string, error) {
	params := Params{
		Owner:              p.Owner,
		Port:               p.Port,
		AllowedSources:     p.AllowedSources,
		DeniedDestinations: VMDeniedDestinations,
		AuthHelper:         VMLeaseAuth,
		KeyFile:            VMLeaseKey,
		RevokedFile:        VMRevokedFile,
	}
	files := []WriteFile{
		{Path: VMStagingDir + "/fetch-lease-key.py", Permissions: "0600", Content: LeaseKeyFetcher},
		{Path: VMStagingDir + "/lease-auth.pl", Permissions: "0600", Content: LeaseAuthHelper},
	}
	var sessionAddresses [][]string
	if err := p.IPv6.Validate(); err != nil {
		return "", err
	}
	if p.IPv6 != nil {
		// The rules are written at boot, once the range is known; without
		// one the file stays empty and Squid leaves from the VM's own
		// addresses.
		params.SessionAddressesInclude = VMSessionAddresses
		files = append(files, WriteFile{Path: VMStagingDir + "/session-addresses.py", Permissions: "0600", Content: SessionAddressScript})
		script := fmt.Sprintf("python3 %s/session-addresses.py %s %s %d %d || : > %s",
			VMStagingDir, VMSessionAddresses, p.LeaseKey.Cloud, p.IPv6.Count(), p.IPv6PrefixLength, VMSessionAddresses)
		sessionAddresses = [][]string{{"sh", "-c", script}}
	}
	conf, err := Render(params)
	if err != nil {
		return "", err
	}
	runcmd := [][]string{
		p.LeaseKey.Command(VMStagingDir+"/fetch-lease-key.py", VMStagingDir+"/lease.key"),
		{"install", "-o", "root", "-g", "root", "-m", "0644", VMStagingDir + "/squid.conf", VMSquidConf},
		// proxy is Debian's squid user (uid 13), present in every image.
		{"install", "-o", "root", "-g", "proxy", "-m", "0640", VMStagingDir + "/lease.key", VMLeaseKey},
		{"install", "-D", "-o", "root", "-g", "root", "-m", "0755", VMStagingDir + "/lease-auth.pl", VMLeaseAuth},
		{"rm", "-rf", VMStagingDir},
		// Squid serves only with its key: without one it stays down,
		// the health probe fails and the proxy is replaced.
		{"sh", "-c", "if test -s " + VMLeaseKey + "; then systemctl enable squid && systemctl restart squid; else systemctl disable --now squid; fi"},
	}
	doc, err := yaml.Marshal(CloudConfig{
		PackageUpdate: true,
		Packages:      []string{"squid"},
		WriteFiles:    append([]WriteFile{{Path: VMStagingDir + "/squid.conf", Permissions: "0600", Content: conf}}, files...),
		Runcmd:        append(sessionAddresses, runcmd...),
	})
	if err != nil {
		return "", fmt.Errorf("encoding the cloud-init of %s: %w", p.Owner, err)
	}
	return fmt.Sprintf("#cloud-config\n# Rendered by egress-proxies-operator for Proxy %s: set spec.cloudInit to bring your own.\n%s",
		p.Owner, strings.TrimPrefix(string(doc), "---\n")), nil
}
