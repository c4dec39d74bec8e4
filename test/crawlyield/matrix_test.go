package crawlyield

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// ban is every matrix site's ban rule: 5 violations within 30s ban the IP
// (the network, for a site that counts by network) for an hour.
func withBan(r simweb.Rules) simweb.Rules {
	r.BanAfter, r.BanWindow, r.BanFor = 5, simweb.Duration(30*time.Second), simweb.Duration(time.Hour)
	r.Latency = simweb.Duration(20 * time.Millisecond)
	return r
}

// matrixRules are the ways sites count (docs/performance.md): a token
// bucket, a sliding window, a fixed window, a window per /24 and a
// concurrency limit alone.
var matrixRules = []struct {
	name  string
	rules simweb.Rules
}{
	{"tokenBucket", withBan(simweb.Rules{RatePerSecond: 2, Burst: 4})},
	{"slidingWindow", withBan(simweb.Rules{PerWindow: 4, Window: simweb.Duration(2 * time.Second)})},
	{"fixedWindow", withBan(simweb.Rules{PerWindow: 4, Window: simweb.Duration(2 * time.Second), FixedWindow: true})},
	{"perNetwork", withBan(simweb.Rules{PerWindow: 10, Window: simweb.Duration(time.Second), CountBy: simweb.CountByNetwork})},
	{"concurrency", func() simweb.Rules {
		r := withBan(simweb.Rules{MaxConcurrent: 2})
		r.Latency = simweb.Duration(200 * time.Millisecond) // a slow site: the limit, not the URLs, bounds a crawl
		return r
	}()},
}

// A crawler's client shapes of the matrix.
const (
	clientTunnel    = "tunnel"    // a new tunnel per request
	clientKeepAlive = "keepAlive" // HTTP/1.1, tunnels kept alive
	clientHTTP2     = "http2"     // HTTP/2, two workers' requests multiplexed over one tunnel
	clientInspect   = "inspect"   // HTTP/2 as above, through the inspecting mode
)

var matrixClients = []string{clientTunnel, clientKeepAlive, clientHTTP2, clientInspect}

// h2Group is how many workers share one HTTP/2 connection (a session):
// with four workers a proxy, two sessions a proxy, as browser contexts.
const h2Group = 2

// throughGatewayAs is a crawler on the gateway with one of the matrix's
// client shapes. Tunnelled clients report the site's refusals on their
// sessions, as the docs tell them to; an inspected one need not, the
// gateway sees them.
func throughGatewayAs(w *web, p *product, workers int, shape string) fetcher {
	switch shape {
	case clientTunnel:
		return throughGateway(w, p, workers, false)
	case clientKeepAlive:
		return throughGateway(w, p, workers, true)
	}
	roots, session := w.tls.RootCAs, "w%d"
	if shape == clientInspect {
		roots = x509.NewCertPool()
		roots.AddCert(p.inspectCA)
		session = "w%d.inspect"
	}
	groups := make([]*http.Client, (workers+h2Group-1)/h2Group)
	for g := range groups {
		proxy := &url.URL{Scheme: "http", User: url.UserPassword(fmt.Sprintf(session, g), token), Host: p.gwAddr}
		tlsConfig := w.tls.Clone()
		tlsConfig.RootCAs = roots
		groups[g] = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(proxy), TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, OnProxyConnectResponse: keepRefusal}}
	}
	return func(ctx context.Context, worker int, rawURL string) (outcome, time.Duration) {
		g := worker / h2Group
		o, retry := get(ctx, groups[g], rawURL)
		if shape == clientHTTP2 {
			switch o {
			case wasted:
				reportSession(p, fmt.Sprintf("w%d", g), "rate_limited", rawURL, retry)
			case refused:
				reportSession(p, fmt.Sprintf("w%d", g), "blocked", rawURL, retry)
			}
		}
		return o, retry
	}
}

// cell is one matrix run: pages against the oracle, waste, bans.
type cell struct {
	r      result
	oracle int
}

func (c cell) ofOracle() float64 {
	if c.oracle == 0 {
		return 0
	}
	return float64(c.r.pages) / float64(c.oracle)
}

// runCell crawls one site of rules with shape through proxies for d, with
// share of the site's published rules declared (1: as published; 0: no
// policy), and its oracle for the same time; with warmup, only what came
// after it counts (the oracle too).
func runCell(t testing.TB, block, proxies int, rules simweb.Rules, shape string, share float64, d, warmup time.Duration) cell {
	const perSite = 20000
	workers := 4 * proxies
	w := startWeb(t, block, proxies, []simweb.Rules{rules}, 0)
	politeness := broker.Politeness{Adaptive: true}
	if share > 0 {
		politeness.Policies = policiesUnder(t, w, share)
	}
	p := startProduct(t, w, politeness)
	urls := urlsOf(w, perSite)
	site := w.sites[0]
	var before simweb.Stats
	if warmup > 0 {
		timer := time.AfterFunc(warmup, func() { before = site.Stats() })
		defer timer.Stop()
	}
	r := crawl(w, urls, workers, d, throughGatewayAs(w, p, workers, shape))
	if warmup <= 0 {
		return cell{r: r, oracle: simweb.Oracle(rules, w.proxies, r.elapsed, perSite)}
	}
	after := site.Stats()
	r.pages = after.Pages() - before.Pages()
	r.requests = r.pages + after.Wasted() - before.Wasted()
	r.wasted = after.Wasted() - before.Wasted()
	r.elapsed -= warmup
	return cell{r: r, oracle: simweb.Oracle(rules, w.proxies, r.elapsed, perSite)}
}

// BenchmarkCrawlYieldMatrix crawls each way a site counts (matrixRules)
// with each shape of client (matrixClients) through the gateway, for 15s,
// with the site's published rules declared as a CrawlTarget would: pages
// against the oracle of the same rules, IPs and time, the
// wasted share of requests and the IPs (or networks) banned. With no
// policy at all (`noPolicy`, keep-alive clients), only what comes after
// the first minute counts: learning is the point. The oracle is
// `bare_pages/min`, so the table shows each cell's share of it.
func BenchmarkCrawlYieldMatrix(b *testing.B) {
	block := 72
	for _, rule := range matrixRules {
		for _, shape := range matrixClients {
			b.Run(rule.name+"/"+shape, func(b *testing.B) {
				var c cell
				for b.Loop() {
					c = runCell(b, block, 20, rule.rules, shape, 1, 15*time.Second, 0)
				}
				block += 2
				reportCell(b, c)
			})
		}
		b.Run(rule.name+"/noPolicy", func(b *testing.B) {
			var c cell
			for b.Loop() {
				c = runCell(b, block, 20, rule.rules, clientKeepAlive, 0, 75*time.Second, time.Minute)
			}
			block += 2
			reportCell(b, c)
		})
	}
}

func reportCell(b *testing.B, c cell) {
	b.Logf("%d pages of the oracle's %d (%.2fx), %d wasted of %d requests, %d held by the gateway, banned %v",
		c.r.pages, c.oracle, c.ofOracle(), c.r.wasted, c.r.requests, c.r.held, c.r.banned)
	b.ReportMetric(c.r.pagesPerMinute(), "crawl_pages/min")
	b.ReportMetric(float64(c.oracle)/c.r.elapsed.Minutes(), "bare_pages/min")
	b.ReportMetric(100*c.r.wastedShare(), "crawl_wasted_%")
	b.ReportMetric(float64(c.r.bannedIPs()), "crawl_banned_ips")
}

// TestPoliciesHoldForEveryWayOfCounting: with a little under the site's
// published rules declared (as a careful team does, and as a test machine
// busy with the race detector needs: it may delay a request past the
// jitter allowance), each way a site counts is kept through the gateway by
// every client shape that can keep it: no IP (nor network) banned, no 429,
// and pages flow. (HTTP/2 multiplexed through an opaque tunnel cannot keep a
// per-IP concurrency limit: the gateway does not see its streams; the
// inspecting mode does.)
func TestPoliciesHoldForEveryWayOfCounting(t *testing.T) {
	block := 100
	for _, rule := range matrixRules {
		for _, shape := range []string{clientKeepAlive, clientInspect} {
			t.Run(rule.name+"/"+shape, func(t *testing.T) {
				c := runCell(t, block, 4, rule.rules, shape, 0.8, 3*time.Second, 0)
				block += 2
				t.Logf("%d pages of the oracle's %d, %d wasted of %d, banned %v", c.r.pages, c.oracle, c.r.wasted, c.r.requests, c.r.banned)
				require.Positive(t, c.r.pages)
				assert.Empty(t, c.r.banned, "no IP (nor network) banned")
				assert.Zero(t, c.r.wasted, "no request refused")
			})
		}
	}
}
