package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Destinations is what the fleet's proxies let a client reach. The gateway
// refuses the rest itself, before it picks a proxy: a request no proxy
// would carry costs no upstream connection, and its refusal (a Squid 403)
// is never taken for a site's block of the proxy.
type Destinations struct {
	// ConnectPorts are the ports a CONNECT may name, HTTPPorts those of a
	// plain-HTTP request; nil takes the Managed proxies' own rules (443,
	// and 80 and 443). A set holding 0 lets every port through (External
	// proxies that allow more).
	ConnectPorts, HTTPPorts []int
	// Denied are address ranges no proxy reaches: a destination written as
	// an IP literal in one is refused. A name is left to the proxy, which
	// resolves it.
	Denied []netip.Prefix
}

// The Managed proxies' port rules (providers/squidconf).
var (
	DefaultConnectPorts = []int{443}
	DefaultHTTPPorts    = []int{80, 443}
)

// DefaultDeniedDestinations are the ranges every provider's Squid denies
// by default: "this" network, loopback and link-local (the clouds'
// metadata servers), in IPv4 and IPv6.
const DefaultDeniedDestinations = "0.0.0.0/8,127.0.0.0/8,169.254.0.0/16,::1/128,fe80::/10"

// refusal says why a destination is refused ("" when it is not): the RFC
// 9209 error type and a message.
func (d Destinations) refusal(host, port string, connect bool) (errType, msg string) {
	ports, kind := d.HTTPPorts, "a plain-HTTP request"
	if ports == nil {
		ports = DefaultHTTPPorts
	}
	if connect {
		ports, kind = d.ConnectPorts, "a CONNECT"
		if ports == nil {
			ports = DefaultConnectPorts
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return psHTTPRequestError, fmt.Sprintf("port %q is no port number", port)
	}
	if !slices.Contains(ports, 0) && !slices.Contains(ports, n) {
		return psHTTPRequestDenied, fmt.Sprintf("the fleet's proxies take %s to port %s only, not %d", kind, joinPorts(ports), n)
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		ip = ip.Unmap()
		for _, p := range d.Denied {
			if p.Contains(ip) {
				return psDestinationIPProhibited, fmt.Sprintf("the fleet's proxies never reach %s (%s is denied)", ip, p)
			}
		}
	}
	return "", ""
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}

// portList is a flag of ports: "443", "80,443", or "*" for any.
type portList []int

func (p *portList) String() string {
	if p == nil || *p == nil {
		return ""
	}
	if slices.Contains(*p, 0) {
		return "*"
	}
	return joinPorts(*p)
}

func (p *portList) Set(s string) error {
	if strings.TrimSpace(s) == "*" {
		*p = []int{0}
		return nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q is no port (1-65535, or * for any)", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return fmt.Errorf("no port given (use * for any)")
	}
	*p = out
	return nil
}

// prefixList is a flag of CIDRs, comma-separated; empty denies nothing.
type prefixList []netip.Prefix

func (p *prefixList) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

func (p *prefixList) Set(s string) error {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		x, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("%q is not a CIDR: %w", f, err)
		}
		out = append(out, x.Masked())
	}
	*p = out
	return nil
}
