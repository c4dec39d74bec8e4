package broker

import (
	"context"
	"net"
	"net/netip"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// Resolver looks up a host's addresses of one family ("ip6"): what a
// dual-stack proxy's Squid would reach it at. *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// How long a host's family is remembered (a failed lookup less long), how
// many hosts are, and how long a lookup may take.
const (
	familyTTL        = 5 * time.Minute
	familyFailureTTL = 30 * time.Second
	maxFamilyHosts   = 10000
	familyTimeout    = 2 * time.Second
)

// hostFamilies says whether a host is reached over IPv6 (it has an AAAA
// record: Squid then connects to it over IPv6, from the proxy's IPv6 range
// when the proxy is dual-stack, whose /64 is the proxy's sender there).
// Answers are cached per host; an address literal needs no lookup.
type hostFamilies struct {
	resolver Resolver
	clock    clock.PassiveClock
	cache    *lru.Cache // host -> familyAnswer
}

type familyAnswer struct {
	ipv6  bool
	until time.Time
}

func newHostFamilies(r Resolver, clk clock.PassiveClock) *hostFamilies {
	if r == nil {
		r = net.DefaultResolver
	}
	return &hostFamilies{resolver: r, clock: clk, cache: lru.New(maxFamilyHosts)}
}

// overIPv6 says whether host is reached over IPv6; a lookup that fails
// says no (the proxy's IPv4 sender), for a shorter while.
func (f *hostFamilies) overIPv6(ctx context.Context, host string) bool {
	if addr, err := netip.ParseAddr(host); err == nil {
		return addr.Is6() && !addr.Is4In6()
	}
	now := f.clock.Now()
	if v, ok := f.cache.Get(host); ok && now.Before(v.(familyAnswer).until) {
		return v.(familyAnswer).ipv6
	}
	ctx, cancel := context.WithTimeout(ctx, familyTimeout)
	defer cancel()
	addrs, err := f.resolver.LookupNetIP(ctx, "ip6", host)
	answer := familyAnswer{ipv6: err == nil && len(addrs) > 0, until: now.Add(familyTTL)}
	if err != nil {
		answer.until = now.Add(familyFailureTTL)
	}
	f.cache.Add(host, answer)
	return answer.ipv6
}

// overIPv6Of is overIPv6 for host, asked at most once, and only when a
// dual-stack proxy needs the answer; for one goroutine (one acquire's
// candidates are weighed in turn).
func (f *hostFamilies) overIPv6Of(ctx context.Context, host string) func() bool {
	var asked, answer bool
	return func() bool {
		if !asked {
			asked, answer = true, f.overIPv6(ctx, host)
		}
		return answer
	}
}
