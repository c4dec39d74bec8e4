package gateway_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
)

// TestScrapyKeepsASlidingWindowThroughTheGateway: a real Scrapy spider,
// with its default kept-alive connections, crawls a site that bans an IP
// at its first request over 2 in any second (a sliding log), through the
// gateway with a CrawlTarget of the site's published numbers: every page
// comes, and no IP is banned.
func TestScrapyKeepsASlidingWindowThroughTheGateway(t *testing.T) {
	site, err := simweb.Start("127.0.0.84", true, simweb.Rules{PerWindow: 2, Window: simweb.Duration(time.Second),
		BanAfter: 1, BanWindow: simweb.Duration(time.Minute), BanFor: simweb.Duration(time.Hour)})
	require.NoError(t, err)
	t.Cleanup(site.Close)
	f := newFixtureWith(t, gateway.Options{PaceWait: 30 * time.Second}, clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
		host := "127.0.0.84"
		o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &host, n: 2}}
	})
	const pages = 10
	got, logs := runSpider(t, f, "window-1", pages, site.URL)
	stats := site.Stats()
	assert.Len(t, got, pages, "every page came; spider log:\n%s", logs)
	assert.Empty(t, stats.Banned, "no IP went over the site's window")
	assert.Equal(t, pages, stats.Pages(), "answers: %v", stats.Answers)
}
