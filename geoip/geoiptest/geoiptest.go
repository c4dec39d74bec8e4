// Package geoiptest writes small MaxMind-format databases for tests, with
// MaxMind's own writer: a City-and-ASN layout, as GeoLite2's are.
//
// It must never be imported by production code.
package geoiptest

import (
	"fmt"
	"net"
	"os"

	"github.com/maxmind/mmdbwriter"
	"github.com/maxmind/mmdbwriter/mmdbtype"

	"github.com/example/egress-proxies-operator/geoip"
)

// Write writes to path a database that places each network (a CIDR, or an
// address for its /32 or /128) at its Location. Loopback and private
// networks are allowed: tests place their listeners.
func Write(path string, networks map[string]geoip.Location) error {
	tree, err := mmdbwriter.New(mmdbwriter.Options{DatabaseType: "GeoLite2-City", IncludeReservedNetworks: true, RecordSize: 24})
	if err != nil {
		return err
	}
	for cidr, loc := range networks {
		_, network, err := net.ParseCIDR(cidr)
		if err != nil {
			ip := net.ParseIP(cidr)
			if ip == nil {
				return fmt.Errorf("%q is neither a CIDR nor an address", cidr)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			network = &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}
		}
		record := mmdbtype.Map{}
		if loc.Country != "" {
			record["country"] = mmdbtype.Map{"iso_code": mmdbtype.String(loc.Country)}
		}
		if loc.City != "" {
			record["city"] = mmdbtype.Map{"names": mmdbtype.Map{"en": mmdbtype.String(loc.City)}}
		}
		if loc.ASN != 0 {
			record["autonomous_system_number"] = mmdbtype.Uint32(loc.ASN)
			record["autonomous_system_organization"] = mmdbtype.String(loc.ASNOrg)
		}
		if err := tree.Insert(network, record); err != nil {
			return fmt.Errorf("inserting %s: %w", cidr, err)
		}
	}
	// Written beside path and renamed over it, as a mounted volume's
	// update lands: a reader never sees half a file.
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := tree.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
