package kubernetes

import (
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// renderSquidConfig renders the squid.conf for one proxy pod: Squid's
// files in the pod's emptyDirs, the password file beside squid.conf (both
// projected from the pod's annotations).
func renderSquidConfig(owner string, port int32, s resolved) (string, error) {
	return squidconf.Render(squidconf.Params{
		Owner:              owner,
		Port:               port,
		AllowedSources:     s.AllowedSourceRanges,
		DeniedDestinations: s.DeniedDestinationRanges,
		AuthHelper:         s.AuthHelper,
		PasswordFile:       configDir + "/" + passwordFileKey,
		RunDir:             runDir,
		SpoolDir:           spoolDir,
		LogDir:             logDir,
	})
}
