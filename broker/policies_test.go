package broker

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestPolicyIndex(t *testing.T) {
	t0 := time.Unix(1000, 0)
	x := NewPolicyIndex()
	h := x.Handler()
	h.OnAdd(testenv.CrawlTarget("crawl", "wild", "*.example.com", 10, t0), false)
	h.OnAdd(testenv.CrawlTarget("crawl", "shop", "shop.example.com", 2, t0.Add(time.Minute)), false)
	h.OnAdd(testenv.CrawlTarget("crawl", "shop-late", "shop.example.com", 50, t0.Add(time.Hour)), false)
	h.OnAdd(testenv.CrawlTarget("other", "shop", "shop.example.com", 5, t0), false)

	p, ok := x.For("crawl", "shop.example.com")
	assert.True(t, ok)
	assert.Equal(t, "crawl/shop", p.Name, "the exact host beats the wildcard; the older of two for one host wins")
	assert.Equal(t, lease.WindowPace(2, time.Second), p.Pace.Interval, "2 in any second: one each 525ms")
	p, ok = x.For("crawl", "www.example.com")
	assert.True(t, ok)
	assert.Equal(t, "crawl/wild", p.Name)
	_, ok = x.For("crawl", "example.org")
	assert.False(t, ok)
	_, ok = x.For("nobody", "shop.example.com")
	assert.False(t, ok, "a namespace's policies govern its own proxies only")

	names := []string{}
	for _, p := range x.ForHost("shop.example.com") {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"crawl/shop", "other/shop"}, names)
	assert.Equal(t, []string{"shop.example.com"}, x.exactHosts())

	h.OnDelete(toolscache.DeletedFinalStateUnknown{Obj: testenv.CrawlTarget("crawl", "shop", "shop.example.com", 2, t0)})
	p, _ = x.For("crawl", "shop.example.com")
	assert.Equal(t, "crawl/shop-late", p.Name, "the next in line takes over")
}

func TestPolicyOfKeepsAReserveOfTheBurst(t *testing.T) {
	ct := testenv.CrawlTarget("crawl", "shop", "shop.example.com", 4, time.Unix(0, 0))
	fleet := int32(100)
	conc := int32(2)
	ct.Spec.FleetRequestsPerInterval, ct.Spec.MaxConcurrentPerIP = &fleet, &conc
	p := PolicyOf(ct)
	assert.Equal(t, lease.Pace{Interval: 262500 * time.Microsecond, Burst: 1, MaxConcurrent: 2, FleetKey: "crawl/shop", FleetInterval: 10500 * time.Microsecond, FleetBurst: 1},
		p.Pace, "a bound over any window: even spacing, 5% kept for jitter, no burst")

	burst := int32(4)
	ct.Spec.Burst = &burst // the token-bucket reading, asked for
	p = PolicyOf(ct)
	assert.Equal(t, lease.Pace{Interval: 250 * time.Millisecond, Burst: 4, MaxConcurrent: 2, FleetKey: "crawl/shop", FleetInterval: 10 * time.Millisecond, FleetBurst: 100}, p.Pace)
	assert.Equal(t, 3, withJitterReserve(p.Pace).Burst)
	assert.Equal(t, 99, withJitterReserve(p.Pace).FleetBurst)
	assert.Equal(t, 1, withJitterReserve(lease.Pace{Interval: time.Second, Burst: 1}).Burst, "a burst of one has nothing to spare")
}

// staticPolicy is one policy for its host, in every namespace.
type staticPolicy struct{ p Policy }

func (s staticPolicy) ForHost(host string) []Policy {
	if host == s.p.Host {
		return []Policy{s.p}
	}
	return nil
}

// TestAPolicyCountedByNetwork: with countBy Network, the proxies whose
// exit IPs share a /24 (or a /64) share one bucket, and a proxy of another
// network keeps its own; by IP, each sender is its own: an IPv4 address,
// or an IPv6 /64 (--ipv6-identity-prefix), whatever the proxies.
func TestAPolicyCountedByNetwork(t *testing.T) {
	ct := testenv.CrawlTarget("crawl", "shop", "shop.example", 2, time.Unix(0, 0))
	ct.Spec.CountBy = crawlv1alpha1.CountByNetwork
	policy := PolicyOf(ct)
	require.True(t, policy.ByNetwork)
	f := &brokerFixture{view: NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	f.broker = New(Options{Store: lease.NewMemoryStore(f.clock), View: f.view, Clock: f.clock, Politeness: Politeness{Policies: staticPolicy{policy}}})
	f.proxy("a", "203.0.113.5")
	f.proxy("b", "203.0.113.77")
	f.proxy("c", "198.51.100.1")
	paceOf := f.broker.paceOf(context.Background(), "shop.example")
	assert.Equal(t, "net:203.0.113.0/24", paceOf("crawl/a").Bucket)
	assert.Equal(t, paceOf("crawl/a").Bucket, paceOf("crawl/b").Bucket, "one network, one bucket")
	assert.Equal(t, "net:198.51.100.0/24", paceOf("crawl/c").Bucket)
	f.proxy("v6a", "2001:db8:1:2:3::9")
	assert.Equal(t, "net:2001:db8:1:2::/64", paceOf("crawl/v6a").Bucket)
	f.proxy("none", "")
	assert.Empty(t, paceOf("crawl/none").Bucket, "no address: the proxy's own bucket")

	ct.Spec.CountBy = crawlv1alpha1.CountByIP
	f.broker.opts.Politeness.Policies = staticPolicy{PolicyOf(ct)}
	paceOf = f.broker.paceOf(context.Background(), "shop.example")
	assert.Equal(t, "ip:203.0.113.5", paceOf("crawl/a").Bucket, "by IP: each IPv4 address its own")
	assert.NotEqual(t, paceOf("crawl/a").Bucket, paceOf("crawl/b").Bucket)
	f.proxy("v6b", "2001:db8:1:2:ffff::1")
	f.proxy("v6c", "2001:db8:1:3::1")
	assert.Equal(t, "ip:2001:db8:1:2::/64", paceOf("crawl/v6a").Bucket, "an IPv6 address counts as its /64")
	assert.Equal(t, paceOf("crawl/v6a").Bucket, paceOf("crawl/v6b").Bucket, "one /64, one sender")
	assert.NotEqual(t, paceOf("crawl/v6a").Bucket, paceOf("crawl/v6c").Bucket, "another /64, another sender")
	assert.ElementsMatch(t, []string{"crawl/v6b"}, f.view.SameSender("crawl/v6a", func() bool { return false }, 10))
}

// resolverOf answers AAAA lookups for the hosts it has, and no other.
type resolverOf map[string]bool

func (r resolverOf) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	if network == "ip6" && r[host] {
		return []netip.Addr{netip.MustParseAddr("2001:db8:ffff::1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestADualStackProxyIsTwoSenders: a dual-stack proxy reaches a site with
// an IPv6 address from its IPv6 range, so there it counts with every proxy
// whose range shares the /64; a site reached over IPv4 sees its IPv4
// address, its own. A refusal over IPv6 reaches the /64's proxies, one
// over IPv4 none.
func TestADualStackProxyIsTwoSenders(t *testing.T) {
	policies := NewPolicyIndex()
	policies.Handler().OnAdd(testenv.CrawlTarget("crawl", "shop", "*.example", 2, time.Unix(0, 0)), false)
	f := &brokerFixture{view: NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Unix(0, 0))}
	f.broker = New(Options{DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, DefaultCooldown: DefaultCooldown, Store: lease.NewMemoryStore(f.clock), View: f.view, Clock: f.clock, Politeness: Politeness{Policies: policies},
		Resolver: resolverOf{"v6.example": true, "w6.example": true}})
	for name, addrs := range map[string][2]string{
		"a": {"203.0.113.5", "2001:db8:6:1:0:1::/96"},
		"b": {"203.0.113.6", "2001:db8:6:1:0:2::/96"},
		"c": {"203.0.113.7", "2001:db8:6:2:0:1::/96"},
	} {
		p := &crawlv1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
			Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, External: &crawlv1alpha1.ExternalEndpoint{Address: addrs[0]}, Port: 3128},
			Status:     crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: addrs[0], Port: 3128, IPv6Prefix: addrs[1], SessionAddresses: 4},
		}
		testenv.SetHealth(p, metav1.ConditionTrue, "x")
		f.view.Upsert(p)
	}
	ctx := context.Background()
	overV6 := f.broker.paceOf(ctx, "v6.example")
	assert.Equal(t, "ip:2001:db8:6:1::/64", overV6("crawl/a").Bucket)
	assert.Equal(t, overV6("crawl/a").Bucket, overV6("crawl/b").Bucket, "one subnet's /64: one sender over IPv6")
	assert.Equal(t, "ip:2001:db8:6:2::/64", overV6("crawl/c").Bucket)
	overV4 := f.broker.paceOf(ctx, "v4.example")
	assert.Equal(t, "ip:203.0.113.5", overV4("crawl/a").Bucket)
	assert.NotEqual(t, overV4("crawl/a").Bucket, overV4("crawl/b").Bucket, "over IPv4 each its own address")

	assert.ElementsMatch(t, []string{"crawl/b"}, f.view.SameSender("crawl/a", f.broker.families.overIPv6Of(ctx, "v6.example"), 10))
	assert.Empty(t, f.view.SameSender("crawl/a", f.broker.families.overIPv6Of(ctx, "v4.example"), 10))
	assert.True(t, f.broker.families.overIPv6(ctx, "2001:db8::7"), "an address literal needs no lookup")
	assert.False(t, f.broker.families.overIPv6(ctx, "198.51.100.1"))

	// A session's tunnel to a site reached over IPv6 leaves from its own
	// address of the range, which the gateway names in X-Egress-IP; to an
	// IPv4 site, from the proxy's IPv4 address.
	up, err := f.broker.Tunnel(ctx, TunnelRequest{Tenant: tenant.Platform, Session: "s1", Host: "v6.example", TTL: time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	prefix := netip.MustParsePrefix(map[string]string{"crawl/a": "2001:db8:6:1:0:1::/96", "crawl/b": "2001:db8:6:1:0:2::/96", "crawl/c": "2001:db8:6:2:0:1::/96"}[up.ProxyID])
	want, err := netid.SessionAddress(prefix, netid.SessionIndex("s1", 4))
	require.NoError(t, err)
	assert.Equal(t, want.String(), up.ExitIP)
	assert.Equal(t, strconv.Itoa(netid.SessionIndex("s1", 4)), up.SessionAddress)
	rotating, err := f.broker.Tunnel(ctx, TunnelRequest{Tenant: tenant.Platform, Host: "w6.example", TTL: time.Minute})
	require.NoError(t, err)
	assert.Empty(t, rotating.SessionAddress)
	assert.True(t, strings.HasPrefix(rotating.ExitIP, "2001:db8:6:") && strings.HasSuffix(rotating.ExitIP, "::"), "the range's own address: %s", rotating.ExitIP)
	v4, err := f.broker.Tunnel(ctx, TunnelRequest{Tenant: tenant.Platform, Session: "s2", Host: "v4.example", TTL: time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(v4.ExitIP, "203.0.113."), "over IPv4, its IPv4 address: %s", v4.ExitIP)
}
