package crawlyield

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// siteRules are the benchmark's sites (docs/performance.md lists them):
// each IP may send 2 requests a second after a burst of 4, at most 2 at
// once; 5 violations within 30s ban it for an hour. One site blocks two of
// the fleet's IPs, one answers two with block pages and hides its limits
// behind block pages too, and the last is plain HTTP.
func siteRules(proxyBlock int) []simweb.Rules {
	base := simweb.Rules{RatePerSecond: 2, Burst: 4, MaxConcurrent: 2, BanAfter: 5,
		BanWindow: simweb.Duration(30 * time.Second), BanFor: simweb.Duration(time.Hour), Latency: simweb.Duration(20 * time.Millisecond)}
	blocking, soft := base, base
	blocking.Blocked = []string{fmt.Sprintf("127.0.%d.1", proxyBlock), fmt.Sprintf("127.0.%d.2", proxyBlock)}
	soft.SoftBlocked = []string{fmt.Sprintf("127.0.%d.3", proxyBlock), fmt.Sprintf("127.0.%d.4", proxyBlock)}
	soft.SoftViolations = true
	return []simweb.Rules{base, blocking, soft, base}
}

// TestPolicyHoldsThroughTheGateway: with policies a little under the
// sites' published rules, 32 crawlers through the gateway get pages from every
// site, and no site bans an IP or answers a single 429.
func TestPolicyHoldsThroughTheGateway(t *testing.T) {
	const block = 62
	w := startWeb(t, block, 5, siteRules(block), 1)
	p := startProduct(t, w, broker.Politeness{Policies: policiesUnder(t, w, 0.8), Adaptive: true})
	r := crawl(w, urlsOf(w, 200), 32, 4*time.Second, throughGateway(w, p, 32, false))
	t.Logf("pages %d, wasted %d of %d requests, held %d, banned %v", r.pages, r.wasted, r.requests, r.held, r.banned)
	require.Positive(t, r.pages)
	for _, s := range w.sites {
		st := s.Stats()
		assert.Positive(t, st.Pages(), "site %s served pages", s.Host)
		assert.Zero(t, st.Answers[simweb.AnswerLimited], "site %s answered no 429", s.Host)
		assert.Empty(t, st.Banned, "site %s banned no IP", s.Host)
	}
	// Blocked and soft-blocked IPs are the only waste: the policy cannot
	// know them before the site says so, and each may carry its burst
	// (less the reserve) before the crawler's report cools it.
	listed := 0
	for _, s := range w.sites {
		listed += len(s.Rules.Blocked) + len(s.Rules.SoftBlocked)
	}
	assert.LessOrEqual(t, r.wasted, listed*(siteRules(block)[0].Burst-1), "at most the requests that found the block lists")
}

// BenchmarkCrawlYield runs one workload (4 sites x 2,000 URLs, 64
// crawlers, 20 proxies, 20 s each) in every way a crawler team can use a
// fleet, beside the oracle: pages per minute (`<way>_pages/min` against
// `bare_pages/min`, the oracle), the wasted share of requests and the IPs
// the sites banned.
func BenchmarkCrawlYield(b *testing.B) {
	const (
		block   = 60
		proxies = 20
		perSite = 2000
		workers = 64
		runFor  = 20 * time.Second
	)
	w := startWeb(b, block, proxies, siteRules(block), 1)
	urls := urlsOf(w, perSite)
	best := oracle(w, runFor, perSite)
	b.Logf("oracle: %d pages in %s (%.0f/min)", best, runFor, float64(best)/runFor.Minutes())
	ways := []struct {
		name string
		run  func(b *testing.B) result
	}{
		{"naive", func(*testing.B) result { return crawl(w, urls, workers, runFor, naive(w)) }},
		{"gateway", func(b *testing.B) result {
			p := startProduct(b, w, broker.Politeness{})
			return crawl(w, urls, workers, runFor, throughGateway(w, p, workers, false))
		}},
		{"leases", func(b *testing.B) result {
			p := startProduct(b, w, broker.Politeness{})
			fetch, done := throughLeases(w, p, workers)
			defer done()
			return crawl(w, urls, workers, runFor, fetch)
		}},
		{"polite", func(b *testing.B) result {
			p := startProduct(b, w, broker.Politeness{Policies: publishedPolicies(b, w), Adaptive: true})
			return crawl(w, urls, workers, runFor, throughGateway(w, p, workers, false))
		}},
		{"politeKeepAlive", func(b *testing.B) result {
			p := startProduct(b, w, broker.Politeness{Policies: publishedPolicies(b, w), Adaptive: true})
			return crawl(w, urls, workers, runFor, throughGateway(w, p, workers, true))
		}},
		{"adaptive", func(b *testing.B) result {
			p := startProduct(b, w, broker.Politeness{Adaptive: true})
			return crawl(w, urls, workers, runFor, throughGateway(w, p, workers, false))
		}},
	}
	for _, way := range ways {
		b.Run(way.name, func(b *testing.B) {
			var r result
			for b.Loop() {
				r = way.run(b)
			}
			b.Logf("%s: %d pages, %d wasted of %d requests, %d held by the gateway, banned %v", way.name, r.pages, r.wasted, r.requests, r.held, r.banned)
			b.ReportMetric(r.pagesPerMinute(), way.name+"_pages/min")
			b.ReportMetric(float64(best)/runFor.Minutes(), "bare_pages/min")
			b.ReportMetric(100*r.wastedShare(), way.name+"_wasted_%")
			b.ReportMetric(float64(r.bannedIPs()), way.name+"_banned_ips")
		})
	}
}
