package squidconf

import (
	_ "embed" // the session-address script ships as a file of its own
	"fmt"
	"net/netip"
	"strings"

	"github.com/example/egress-proxies-operator/netid"
)

// SessionAddressScript is the script a VM with IPv6 egress runs at boot
// (session-addresses.py): it reads the VM's IPv6 range from the cloud's
// metadata server, routes it to the VM and writes SessionAddressRules for
// it into VMSessionAddresses, which squid.conf includes.
//
//go:embed session-addresses.py
var SessionAddressScript string

// VMSessionAddresses is the squid.conf include a VM's session addresses
// are written to at boot (empty without an IPv6 range).
const VMSessionAddresses = "/etc/squid/session-addresses.conf"

// DefaultSessionAddresses is how many addresses of its IPv6 range a VM's
// Squid leaves from when the provider's ipv6 settings do not say.
const DefaultSessionAddresses = 16

// IPv6Egress is a provider's ipv6 settings: its VMs are dual-stack, with an
// IPv6 range each (GCP's /96, AWS's delegated /80), and Squid leaves from
// SessionAddresses addresses of it, one chosen per gateway session. Sites
// count the whole /64 as one sender all the same.
type IPv6Egress struct {
	// SessionAddresses is how many (1-256; default 16).
	SessionAddresses int `json:"sessionAddresses,omitempty"`
}

// Count is the number of session addresses, the default applied.
func (e *IPv6Egress) Count() int {
	if e == nil {
		return 0
	}
	if e.SessionAddresses == 0 {
		return DefaultSessionAddresses
	}
	return e.SessionAddresses
}

// Validate checks e (nil: IPv4 only).
func (e *IPv6Egress) Validate() error {
	if e != nil && (e.SessionAddresses < 0 || e.SessionAddresses > netid.MaxSessionAddresses) {
		return fmt.Errorf("ipv6.sessionAddresses must be between 1 and %d, got %d", netid.MaxSessionAddresses, e.SessionAddresses)
	}
	return nil
}

// SessionAddressRules are the squid.conf lines that make Squid leave from
// addresses[i] for a request whose netid.SessionHeader is i (one header
// ACL and one tcp_outgoing_address each), and from base, the range's own
// address, for any other: a VM may have no other IPv6 address to leave
// from. Squid uses an address only for destinations of its family, and
// drops the header (squid.conf's request_header_access) before anything
// leaves.
func SessionAddressRules(base netip.Addr, addresses []netip.Addr) string {
	var b strings.Builder
	for i, a := range addresses {
		fmt.Fprintf(&b, "acl session_address_%d req_header %s ^%d$\n", i, netid.SessionHeader, i)
		fmt.Fprintf(&b, "tcp_outgoing_address %s session_address_%d\n", a, i)
	}
	fmt.Fprintf(&b, "tcp_outgoing_address %s\n", base)
	return b.String()
}

// SessionAddressesOf are the first n session addresses of prefix
// (netid.SessionAddress), as a VM's script derives them: fewer when the
// range has fewer.
func SessionAddressesOf(prefix netip.Prefix, n int) []netip.Addr {
	out := make([]netip.Addr, 0, n)
	for i := range n {
		a, err := netid.SessionAddress(prefix, i)
		if err != nil {
			break
		}
		out = append(out, a)
	}
	return out
}

// RangeRules are the lines a VM's script writes for its range: its first
// n session addresses (SessionAddressesOf), the range's own address for
// any other request.
func RangeRules(prefix netip.Prefix, n int) string {
	return SessionAddressRules(prefix.Masked().Addr(), SessionAddressesOf(prefix, n))
}
