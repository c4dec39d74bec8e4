package crawlyield

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// subscriberRules is a site that counts an IPv6 address by its /64, as
// most sites and WAFs do (one subscriber's allocation), and an IPv4
// address by itself: 2 requests a second after a burst of 4, at most 2 at
// once; 5 violations within 30s ban the sender for an hour.
func subscriberRules() simweb.Rules {
	return withBan(simweb.Rules{RatePerSecond: 2, Burst: 4, MaxConcurrent: 2, IPv6Prefix: 64})
}

// ipv6Exits are the IPv6 addresses n proxies leave from, perNetwork of
// them in each /64 (documentation addresses: the sites see them, no test
// dials them).
func ipv6Exits(n, perNetwork int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("2001:db8:6:%x::%x", i/perNetwork+1, i%perNetwork+10)
	}
	return out
}

// ipv6Cell crawls one subscriberRules site through proxies that leave from
// exits (nil: their own IPv4 addresses), with share of the site's
// published rules declared per IP as a team reads them, the product
// counting one sender by identity; its oracle is the most the site allows
// its senders.
func ipv6Cell(t testing.TB, block, proxies int, exits []string, identity netid.Rule, share float64, workers int, d time.Duration) cell {
	t.Helper()
	const perSite = 20000
	w := startWeb(t, block, proxies, []simweb.Rules{subscriberRules()}, 0)
	if exits != nil {
		w.seeAs(exits)
	}
	p := startCounting(t, w, broker.Politeness{Policies: policiesUnder(t, w, share), Adaptive: true}, lease.NewMemoryStore(nil), identity)
	r := crawl(w, urlsOf(w, perSite), workers, d, throughGateway(w, p, workers, true))
	return cell{r: r, oracle: simweb.Oracle(subscriberRules(), w.exitIPs(), r.elapsed, perSite)}
}

// TestAnIPv6NetworkIsOneSender: four proxies whose exit IPs share one
// /64, on a site that counts by /64, are one sender to the fleet: paced as
// one, nothing refused, nothing banned. Counted per address instead
// (--ipv6-identity-prefix=128, what a fleet that treats IPv6 addresses as
// IPv4 ones does), the same crawl gets the /64 banned. Four proxies in four
// /64s are four senders: they get more than twice the pages of one.
func TestAnIPv6NetworkIsOneSender(t *testing.T) {
	const proxies, workers, d = 4, 16, 4 * time.Second
	shared := ipv6Cell(t, 140, proxies, ipv6Exits(proxies, proxies), netid.Rule{}, 0.8, workers, d)
	t.Logf("one /64: %d pages of the oracle's %d, %d wasted of %d, banned %v", shared.r.pages, shared.oracle, shared.r.wasted, shared.r.requests, shared.r.banned)
	require.Positive(t, shared.r.pages)
	assert.Empty(t, shared.r.banned, "one /64 paced as one sender: no ban")
	assert.Zero(t, shared.r.wasted, "nothing refused")

	perAddress := ipv6Cell(t, 142, proxies, ipv6Exits(proxies, proxies), netid.Rule{IPv6Prefix: 128}, 0.8, workers, d)
	t.Logf("one /64 counted per address: %d pages, %d wasted of %d, banned %v", perAddress.r.pages, perAddress.r.wasted, perAddress.r.requests, perAddress.r.banned)
	assert.Equal(t, map[string][]string{"127.0.143.1": {"2001:db8:6:1::/64"}}, perAddress.r.banned,
		"counted per address, the four proxies overrun the /64, and the site bans it")

	distinct := ipv6Cell(t, 144, proxies, ipv6Exits(proxies, 1), netid.Rule{}, 0.8, workers, d)
	t.Logf("four /64s: %d pages of the oracle's %d, %d wasted of %d, banned %v", distinct.r.pages, distinct.oracle, distinct.r.wasted, distinct.r.requests, distinct.r.banned)
	assert.Empty(t, distinct.r.banned)
	assert.Greater(t, distinct.r.pages, 2*shared.r.pages, "four senders get more than twice the pages of one")
}

// BenchmarkCrawlYieldIPv6 crawls a site that counts IPv6 by /64
// (subscriberRules) for 15s with 20 proxies and 80 keep-alive crawlers,
// the site's published rules declared per IP: IPv4 addresses (`ipv4`), IPv6 ones in
// 20 /64s (`ipv6Distinct`), in 5 /64s of 4 (`ipv6Shared`), and the same
// counted per address (`ipv6SharedPerAddress`, --ipv6-identity-prefix=128):
// pages against the oracle, waste and senders banned.
func BenchmarkCrawlYieldIPv6(b *testing.B) {
	const proxies, workers, d = 20, 80, 15 * time.Second
	block := 150
	ways := []struct {
		name     string
		exits    []string
		identity netid.Rule
	}{
		{"ipv4", nil, netid.Rule{}},
		{"ipv6Distinct", ipv6Exits(proxies, 1), netid.Rule{}},
		{"ipv6Shared", ipv6Exits(proxies, 4), netid.Rule{}},
		{"ipv6SharedPerAddress", ipv6Exits(proxies, 4), netid.Rule{IPv6Prefix: 128}},
	}
	for _, way := range ways {
		b.Run(way.name, func(b *testing.B) {
			var c cell
			for b.Loop() {
				c = ipv6Cell(b, block, proxies, way.exits, way.identity, 1, workers, d)
			}
			block += 2
			reportCell(b, c)
		})
	}
}
