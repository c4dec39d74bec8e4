package geo

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/geoip"
)

// Options are the geo controller's flags.
type Options struct {
	// Databases are the database files (none: the controller is off).
	Databases       []string
	RefreshInterval time.Duration
}

// Enabled says whether a database was given.
func (o *Options) Enabled() bool { return len(o.Databases) > 0 }

// AddFlags registers the geo controller's flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.Func("geoip-database", "A MaxMind-format database file (GeoLite2-City, GeoLite2-ASN, DB-IP Lite or a commercial one) "+
		"that places each proxy's exit IP in status.geo and the attributes country, city, asn and asnOrg. "+
		"Repeat it, or separate files with commas, for a City and an ASN database. None: no geo.", func(v string) error {
		for _, path := range strings.Split(v, ",") {
			if path = strings.TrimSpace(path); path != "" {
				o.Databases = append(o.Databases, path)
			}
		}
		return nil
	})
	fs.DurationVar(&o.RefreshInterval, "geoip-refresh-interval", geoip.DefaultRefreshInterval,
		"How often the geo database files are checked for a new version (a changed modification time or size).")
}

// Validate checks the geo controller's flags.
func (o *Options) Validate() error {
	if o.RefreshInterval <= 0 {
		return fmt.Errorf("--geoip-refresh-interval must be positive, got %s", o.RefreshInterval)
	}
	return nil
}
