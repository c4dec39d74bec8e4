package geo

import (
	"fmt"
	"strconv"
	"strings"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/geoip"
)

// Judge is p's status.geo for what the database says of its exit IP (nil:
// no exit IP, or the database does not know it).
func Judge(p *crawlv1alpha1.Proxy, loc geoip.Location, found bool) *crawlv1alpha1.ProxyGeo {
	ip := p.ExitIP()
	if ip == "" || !found {
		return nil
	}
	g := &crawlv1alpha1.ProxyGeo{IP: ip, Country: loc.Country, City: loc.City, ASN: int64(loc.ASN), ASNOrg: loc.ASNOrg}
	g.Mismatch = strings.Join(mismatches(p, loc), "; ")
	return g
}

// mismatches are what p declares that the database contradicts: its
// country and asn attributes, and the country of its cloud region (a
// Managed proxy's placement, an External one's region attribute). What
// the database does not know contradicts nothing; cities are not checked,
// the databases being least sure of them.
func mismatches(p *crawlv1alpha1.Proxy, loc geoip.Location) []string {
	var out []string
	if declared := p.Spec.Attributes[crawlv1alpha1.AttrCountry]; declared != "" && loc.Country != "" && !strings.EqualFold(declared, loc.Country) {
		out = append(out, fmt.Sprintf("country %s is declared; the database places the exit IP in %s", declared, loc.Country))
	}
	if declared := p.Spec.Attributes[crawlv1alpha1.AttrASN]; declared != "" && loc.ASN != 0 {
		if n, err := strconv.ParseUint(strings.TrimPrefix(strings.ToUpper(declared), "AS"), 10, 32); err != nil || uint32(n) != loc.ASN {
			out = append(out, fmt.Sprintf("asn %s is declared; the database says AS%d (%s)", declared, loc.ASN, loc.ASNOrg))
		}
	}
	if region := regionOf(p); region != "" && loc.Country != "" {
		if country, ok := geoip.RegionCountry(region); ok && country != loc.Country {
			out = append(out, fmt.Sprintf("region %s is in %s; the database places the exit IP in %s", region, country, loc.Country))
		}
	}
	return out
}

// regionOf is the cloud region (or zone) p says it runs in: its
// placement's, else its region attribute.
func regionOf(p *crawlv1alpha1.Proxy) string {
	if pl := p.Spec.Placement; pl != nil {
		if pl.Region != "" {
			return pl.Region
		}
		if pl.Zone != "" {
			return pl.Zone
		}
	}
	return p.Spec.Attributes["region"]
}
