package kubernetes

import (
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// renderSquidConfig renders the squid.conf for one proxy pod: Squid's
// files in the pod's emptyDirs, the lease-auth helper and the proxy's
// lease key beside squid.conf (all three from the pod's Secret).
func renderSquidConfig(owner string, port int32, s resolved) (string, error) {
	return squidconf.Render(squidconf.Params{
		Owner:              owner,
		Port:               port,
		AllowedSources:     s.AllowedSourceRanges,
		DeniedDestinations: s.DeniedDestinationRanges,
		Perl:               s.Perl,
		AuthHelper:         configDir + "/" + leaseAuthKey,
		KeyFile:            configDir + "/" + leaseKeyKey,
		RevokedFile:        revokedFile,
		RunDir:             runDir,
		SpoolDir:           spoolDir,
		LogDir:             logDir,
	})
}
