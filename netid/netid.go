// Package netid says what a site sees as one sender: an IPv4 address, or
// the network an IPv6 address belongs to (its /64 unless configured
// otherwise: one subscriber's allocation, which sites rate-limit and ban
// as one). Pacing, the outcome memory, bans and burned addresses all key
// an exit IP by it, so proxies that share a /64 never look to the fleet
// like more senders than a site counts.
//
// It is a leaf: it must never import another package of this module.
package netid

import (
	"flag"
	"fmt"
	"hash/fnv"
	"net/netip"
)

// DefaultIPv6Prefix is the IPv6 network sites count as one sender: the /64
// an ISP or a cloud hands one subscriber or subnet.
const DefaultIPv6Prefix = 64

// Rule is how exit IPs map to the senders sites count. The zero Rule is
// the default (/64).
type Rule struct {
	// IPv6Prefix is the length of the IPv6 network counted as one sender
	// (32-128; 0: DefaultIPv6Prefix).
	IPv6Prefix int
}

func (r Rule) v6Bits() int {
	if r.IPv6Prefix == 0 {
		return DefaultIPv6Prefix
	}
	return r.IPv6Prefix
}

// Of is the sender a site sees ip as: the address itself for IPv4 (and
// IPv4-mapped IPv6), the network "2001:db8:1:2::/64" for IPv6; "" when ip
// is no address. Two exit IPs are one identity when Of gives both the
// same.
func (r Rule) Of(ip string) string {
	return r.of(ip, 32)
}

// Network is the network a site that counts whole ranges sees ip in
// (a CrawlTarget's countBy Network): its /24 for IPv4, the identity's
// network for IPv6; "" when ip is no address.
func (r Rule) Network(ip string) string {
	return r.of(ip, 24)
}

func (r Rule) of(ip string, v4Bits int) string {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}
	addr = addr.Unmap().WithZone("")
	bits := r.v6Bits()
	if addr.Is4() {
		bits = v4Bits
	}
	if bits == addr.BitLen() {
		return addr.String()
	}
	prefix, err := addr.Prefix(bits)
	if err != nil {
		return ""
	}
	return prefix.String()
}

// Contains says whether identity (an Of result) covers ip.
func (r Rule) Contains(identity, ip string) bool {
	return identity != "" && r.Of(ip) == identity
}

// AddFlags registers --ipv6-identity-prefix.
func (r *Rule) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&r.IPv6Prefix, "ipv6-identity-prefix", DefaultIPv6Prefix,
		"Length of the IPv6 network sites count as one sender: proxies whose exit IPs share it are one identity for pacing, the outcome memory, bans and burned addresses (32-128; 128 counts each address).")
}

// Validate checks the flag's value.
func (r Rule) Validate() error {
	if r.IPv6Prefix != 0 && (r.IPv6Prefix < 32 || r.IPv6Prefix > 128) {
		return fmt.Errorf("--ipv6-identity-prefix must be between 32 and 128, got %d", r.IPv6Prefix)
	}
	return nil
}

// RangeAddr is the first address of an IP range ("2001:db8:6:1:0:5::/96"):
// the range's own, which a VM leaves from without a session address, and
// which stands for the range when its sender is asked; "" for no range.
func RangeAddr(prefix string) string {
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		return ""
	}
	return p.Masked().Addr().String()
}

// SessionHeader is the request header in which the gateway names the
// address a session leaves from (its index, 0 to n-1) when it asks a
// proxy that has session addresses: the proxy's Squid leaves from
// SessionAddress(range, i) and never forwards the header.
const SessionHeader = "X-Egress-Session-Address"

// MaxSessionAddresses bounds the addresses a proxy's Squid leaves from
// (one ACL and one tcp_outgoing_address line each).
const MaxSessionAddresses = 256

// SessionAddress is address i (0-based) of an IPv6 range a proxy leaves
// from: the range's first address plus i+1 (the first is the VM's own).
// An error when the range has no such address.
func SessionAddress(prefix netip.Prefix, i int) (netip.Addr, error) {
	if !prefix.IsValid() || i < 0 || i >= MaxSessionAddresses {
		return netip.Addr{}, fmt.Errorf("no session address %d of %q", i, prefix)
	}
	a := prefix.Masked().Addr().As16()
	carry := uint16(i + 1)
	for b := 15; b >= 0 && carry > 0; b-- {
		sum := uint16(a[b]) + carry
		a[b], carry = byte(sum), sum>>8
	}
	addr := netip.AddrFrom16(a)
	if !prefix.Addr().Is6() || !prefix.Contains(addr) {
		return netip.Addr{}, fmt.Errorf("no session address %d of %q", i, prefix)
	}
	return addr, nil
}

// SessionIndex is the address (0 to n-1) session leaves from among n: a
// hash of its key, so it keeps its address on every replica and across
// tunnels.
func SessionIndex(session string, n int) int {
	if n <= 0 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(session))
	return int(h.Sum32() % uint32(n))
}
