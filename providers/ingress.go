package providers

import (
	"errors"
	"fmt"
	"net"
)

// CheckIngress checks a cloud provider's ingress settings (a gcp firewall
// rule, an aws security group) at startup, naming each field at fault by
// its path under field (settings.firewall, say): the source ranges are
// required, CIDRs, and never the whole internet, since a proxy open to it
// is abused within minutes; the ports are ports. Every cloud keeps its
// proxies closed by the same rule.
func CheckIngress(field string, sourceRanges []string, ports []int32) error {
	if len(sourceRanges) == 0 {
		return fmt.Errorf("%s.sourceRanges is required: list the CIDRs your crawlers egress from (the operator opens the proxy port to them alone)", field)
	}
	var errs []error
	for i, cidr := range sourceRanges {
		_, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.sourceRanges[%d]: %q is not a CIDR", field, i, cidr))
			continue
		}
		if ones, _ := ipnet.Mask.Size(); ones == 0 {
			errs = append(errs, fmt.Errorf("%s.sourceRanges[%d]: %q is the whole internet; a proxy open to it is abused within minutes: list your crawlers' egress ranges", field, i, cidr))
		}
	}
	for i, port := range ports {
		if port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("%s.ports[%d]: %d is not a port (1-65535)", field, i, port))
		}
	}
	return errors.Join(errs...)
}
