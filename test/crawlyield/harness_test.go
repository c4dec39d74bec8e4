// Package crawlyield measures what a crawl through the fleet achieves on
// the simulated web (test/simweb): pages per minute against the oracle
// (the most the sites' rules allow with the same IPs in the same time),
// the share of wasted requests, and the IPs each site banned; naive
// rotation beside the product's ways. Its benchmark is BenchmarkCrawlYield
// in `make bench`; its test checks that a policy holds.
package crawlyield

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/client"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const token = "crawl-yield-token"

// debugWaste prints every wasted request, for a reader tuning the rules.
var debugWaste = false

// web is the fleet and the sites: real Squids, each leaving from its own
// loopback address, so a site sees which proxy carried a request.
type web struct {
	proxies []string // the proxies' addresses (IPs), in order
	// exits are the addresses the sites see the proxies' requests come
	// from, in order (seeAs; nil: their own).
	exits []string
	sites []*simweb.Site
	tls   *tls.Config
}

// seeAs makes every site see proxy i's requests come from exits[i] (IPv6
// addresses, which no test may leave from), as the operator's probe
// would have learnt them.
func (w *web) seeAs(exits []string) {
	seen := make(map[string]string, len(exits))
	for i, ip := range w.proxies {
		seen[ip] = exits[i]
	}
	for _, s := range w.sites {
		s.SeeAs(seen)
	}
	w.exits = exits
}

// exitIPs are the addresses the sites see the proxies as.
func (w *web) exitIPs() []string {
	if w.exits != nil {
		return w.exits
	}
	return w.proxies
}

// startWeb starts n Squids on 127.0.<block>.x and one site per rules on
// 127.0.<block+1>.x, the last plainHTTP of them over plain HTTP.
func startWeb(t testing.TB, block, n int, rules []simweb.Rules, plainHTTP int) *web {
	t.Helper()
	w := &web{tls: &tls.Config{MinVersion: tls.VersionTLS12}}
	for i := range n {
		ip := fmt.Sprintf("127.0.%d.%d", block, i+1)
		w.proxies = append(w.proxies, ip)
		squid.Start(t, squid.Config{Address: ip, Port: 3128, Rules: squid.DefaultRules + "tcp_outgoing_address " + ip + "\n"})
	}
	w.tls.RootCAs = x509.NewCertPool()
	for i, r := range rules {
		https := i < len(rules)-plainHTTP
		s, err := simweb.Start(fmt.Sprintf("127.0.%d.%d", block+1, i+1), https, r)
		require.NoError(t, err)
		t.Cleanup(s.Close)
		if https {
			w.tls.RootCAs.AddCert(s.Certificate())
		}
		w.sites = append(w.sites, s)
	}
	return w
}

// product is discovery and the gateway over the web's proxies, as the
// operator runs them, with the given politeness.
type product struct {
	api    *httptest.Server
	gwAddr string
	client *client.Client
	store  lease.Store
	// inspectCA is the CA the inspecting mode mints the sites'
	// certificates from, for every tenant.
	inspectCA *x509.Certificate
}

func startProduct(t testing.TB, w *web, politeness broker.Politeness) *product {
	t.Helper()
	return startReplica(t, w, politeness, lease.NewMemoryStore(nil))
}

// startReplica is startProduct on store: replicas that share a store
// (Redis) share their leases, sessions and paces.
func startReplica(t testing.TB, w *web, politeness broker.Politeness, store lease.Store) *product {
	t.Helper()
	return startCounting(t, w, politeness, store, netid.Rule{})
}

// startCounting is startReplica with identity as what the product counts
// as one sender (--ipv6-identity-prefix).
func startCounting(t testing.TB, w *web, politeness broker.Politeness, store lease.Store, identity netid.Rule) *product {
	t.Helper()
	view := broker.NewView(nil, "operator-ns")
	view.SetIdentity(identity)
	for i, ip := range w.proxies {
		p := &crawlv1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: fmt.Sprintf("p%02d", i)},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"fleet": "bench", "id": fmt.Sprintf("p%02d", i)},
				External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
			Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128},
		}
		if w.exits != nil {
			p.Status.EgressIP = w.exits[i]
		}
		testenv.SetHealth(p, metav1.ConditionTrue, "ProbeSucceeded")
		view.Handler().OnAdd(p, false)
	}
	return startViewProduct(t, view, politeness, store, w.tls.RootCAs)
}

// startViewProduct is discovery and the gateway over view's proxies.
func startViewProduct(t testing.TB, view *broker.View, politeness broker.Politeness, store lease.Store, sitesTrust *x509.CertPool) *product {
	t.Helper()
	ca, err := inspect.NewCA("crawl-yield inspecting CA", time.Now())
	require.NoError(t, err)
	authority := inspect.Static{Cert: &ca}
	server := discovery.NewServer(discovery.Options{
		Store: store, View: view, Tokens: discovery.StaticToken(token),
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown,
		Politeness: politeness, InspectCA: authority,
	})
	p := &product{api: httptest.NewServer(server.Handler()), store: store, inspectCA: ca.Leaf}
	t.Cleanup(p.api.Close)
	// The simulated sites listen on loopback addresses and any port; the
	// inspecting gateway trusts their certificates.
	gw := gateway.New(gateway.Options{Upstreams: server.Tunnels(), Destinations: gateway.Destinations{ConnectPorts: []int{0}, HTTPPorts: []int{0}},
		Inspect: gateway.Inspect{Authority: authority, RootCAs: sitesTrust}})
	server.Broker().OnSessionReport(gw.OnSessionReport)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.gwAddr = lis.Addr().String()
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.client, err = client.New(p.api.URL, token)
	require.NoError(t, err)
	return p
}

// outcome is what one request came to.
type outcome int

const (
	gotPage   outcome = iota
	wasted            // a site's 429 or block page, or a connection error
	refused           // a site's 403: it refuses the IP itself (wasted too)
	held              // the gateway's own 429: no IP may take the host now
	abandoned         // the run ended during it
)

// fetcher fetches one URL for one worker and says what came of it, with
// the Retry-After to honour (zero: none).
type fetcher func(ctx context.Context, worker int, rawURL string) (outcome, time.Duration)

// result is one way's run.
type result struct {
	pages, wasted, held, requests int
	banned                        map[string][]string // site -> IPs it banned
	elapsed                       time.Duration
}

func (r result) pagesPerMinute() float64 { return float64(r.pages) / r.elapsed.Minutes() }

func (r result) wastedShare() float64 {
	if r.requests == 0 {
		return 0
	}
	return float64(r.wasted) / float64(r.requests)
}

func (r result) bannedIPs() int {
	n := 0
	for _, ips := range r.banned {
		n += len(ips)
	}
	return n
}

// crawl runs workers over urls (each site's in turn) for d: a URL that did
// not come back as a page goes to the back of the queue; a worker honours
// the Retry-After it was given.
func crawl(w *web, urls []string, workers int, d time.Duration, fetch fetcher) result {
	for _, s := range w.sites {
		s.Reset()
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	queue := make(chan string, len(urls))
	for _, u := range urls {
		queue <- u
	}
	var pages, wastedN, heldN, requests atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				var u string
				select {
				case u = <-queue:
				default:
					return // every URL fetched
				}
				o, retry := fetch(ctx, i, u)
				switch o {
				case gotPage:
					pages.Add(1)
					requests.Add(1)
					continue
				case wasted, refused:
					wastedN.Add(1)
					requests.Add(1)
				case held:
					heldN.Add(1)
				}
				queue <- u
				if retry > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(retry):
					}
				}
			}
		})
	}
	wg.Wait()
	r := result{pages: int(pages.Load()), wasted: int(wastedN.Load()), held: int(heldN.Load()), requests: int(requests.Load()),
		elapsed: min(time.Since(start), d), banned: map[string][]string{}}
	for _, s := range w.sites {
		if b := s.Stats().Banned; len(b) > 0 {
			r.banned[s.Host] = b
		}
	}
	return r
}

// classify reads a site's answer.
func classify(resp *http.Response) (outcome, time.Duration) {
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	retry, _ := client.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch {
	case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Proxy-Status") != "":
		return held, retry
	case resp.StatusCode == http.StatusOK && !simweb.IsBlockPage(body):
		return gotPage, 0
	}
	if debugWaste {
		fmt.Println("wasted:", resp.StatusCode, resp.Request.URL.Host, strings.TrimSpace(string(body)), resp.Header)
	}
	if resp.StatusCode == http.StatusForbidden {
		return refused, retry
	}
	return wasted, retry
}

// naive is what users get elsewhere: each request through the
// least-loaded proxy, a new connection each time, no reports.
func naive(w *web) fetcher {
	loads := make([]atomic.Int64, len(w.proxies))
	clients := make([]*http.Client, len(w.proxies))
	for i, ip := range w.proxies {
		proxy := &url.URL{Scheme: "http", Host: net.JoinHostPort(ip, "3128")}
		clients[i] = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(proxy), TLSClientConfig: w.tls, DisableKeepAlives: true}}
	}
	var next atomic.Int64
	return func(ctx context.Context, _ int, rawURL string) (outcome, time.Duration) {
		best := int(next.Add(1)) % len(loads)
		for i := range loads {
			if loads[i].Load() < loads[best].Load() {
				best = i
			}
		}
		loads[best].Add(1)
		defer loads[best].Add(-1)
		return get(ctx, clients[best], rawURL)
	}
}

// connectAnswer is where a gateway client's transport leaves the
// gateway's refusal of a CONNECT, which net/http turns into an error.
type connectAnswer struct{ refusal *http.Response }

type connectAnswerKey struct{}

func get(ctx context.Context, c *http.Client, rawURL string) (outcome, time.Duration) {
	answer := &connectAnswer{}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, connectAnswerKey{}, answer), http.MethodGet, rawURL, nil)
	if err != nil {
		return wasted, 0
	}
	resp, err := c.Do(req)
	switch {
	case err != nil && ctx.Err() != nil:
		return abandoned, 0
	case err != nil && answer.refusal != nil:
		return classify(answer.refusal)
	case err != nil:
		if debugWaste {
			fmt.Println("wasted: error", err)
		}
		return wasted, 0
	}
	return classify(resp)
}

// keepRefusal is a gateway client's OnProxyConnectResponse.
func keepRefusal(ctx context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
	if a, ok := ctx.Value(connectAnswerKey{}).(*connectAnswer); ok && resp.StatusCode != http.StatusOK {
		a.refusal = &http.Response{StatusCode: resp.StatusCode, Header: resp.Header.Clone(), Body: http.NoBody}
	}
	return nil
}

// throughGateway is a crawler on the gateway: worker i is session w<i>,
// with a new tunnel per request unless keepAlive, and it reports a
// site's refusal on its session, as the docs tell crawlers to: a 403 as
// blocked, the rest as rate_limited.
func throughGateway(w *web, p *product, workers int, keepAlive bool) fetcher {
	clients := make([]*http.Client, workers)
	for i := range clients {
		proxy := &url.URL{Scheme: "http", User: url.UserPassword(fmt.Sprintf("w%d", i), token), Host: p.gwAddr}
		clients[i] = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(proxy), TLSClientConfig: w.tls, DisableKeepAlives: !keepAlive, OnProxyConnectResponse: keepRefusal}}
	}
	return func(ctx context.Context, worker int, rawURL string) (outcome, time.Duration) {
		o, retry := get(ctx, clients[worker], rawURL)
		switch o {
		case wasted:
			reportSession(p, fmt.Sprintf("w%d", worker), "rate_limited", rawURL, retry)
		case refused:
			reportSession(p, fmt.Sprintf("w%d", worker), "blocked", rawURL, retry)
		}
		return o, retry
	}
}

func reportSession(p *product, session, result, rawURL string, retry time.Duration) {
	u, _ := url.Parse(rawURL)
	body, _ := json.Marshal(map[string]any{"result": result, "target": u.Hostname(), "retryAfterSeconds": int(retry.Seconds())})
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, p.api.URL+"/v1/sessions/"+session+"/report", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_ = resp.Body.Close()
	}
}

// throughLeases is a crawler on the lease API: each worker a Go client
// Transport of its own (a lease per host, kept; it reports refusals).
func throughLeases(w *web, p *product, workers int) (fetcher, func()) {
	clients := make([]*http.Client, workers)
	transports := make([]*client.Transport, workers)
	for i := range clients {
		transports[i] = &client.Transport{Client: p.client, Selector: map[string]string{"fleet": "bench"},
			Base: &http.Transport{TLSClientConfig: w.tls, DisableKeepAlives: true}}
		clients[i] = &http.Client{Timeout: 20 * time.Second, Transport: transports[i]}
	}
	return func(ctx context.Context, worker int, rawURL string) (outcome, time.Duration) {
			o, retry := get(ctx, clients[worker], rawURL)
			if (o == wasted || o == refused) && retry == 0 {
				retry = time.Second // a lease refused: 503 no_proxy_available, with its own Retry-After inside the error
			}
			return o, retry
		}, func() {
			for _, tr := range transports {
				_ = tr.Close()
			}
		}
}

// policyOf is a declared pace equal to a site's published rules, as a
// team reads them into a CrawlTarget: a window's count as its numbers
// (requestsPerInterval per interval), a token bucket's with its burst,
// and the site's way of counting (countBy).
func policyOf(name, host string, r simweb.Rules) broker.Policy {
	p := broker.Policy{Name: name, Host: host, Pace: lease.Pace{MaxConcurrent: r.MaxConcurrent}, ByNetwork: r.CountBy == simweb.CountByNetwork}
	switch {
	case r.PerWindow > 0 && r.Window > 0:
		p.Pace.Interval, p.Pace.Burst = lease.WindowPace(r.PerWindow, time.Duration(r.Window)), 1
	case r.RatePerSecond > 0:
		p.Pace.Interval = time.Duration(float64(time.Second) / r.RatePerSecond)
		p.Pace.Burst = max(r.Burst, 1)
	}
	return p
}

// staticPolicies are policies by host for every namespace.
type staticPolicies map[string]broker.Policy

func (s staticPolicies) ForHost(host string) []broker.Policy {
	if p, ok := s[host]; ok {
		return []broker.Policy{p}
	}
	return nil
}

// publishedPolicies reads each site's published rules into a policy, as a
// crawler team would write its CrawlTargets.
func publishedPolicies(t testing.TB, w *web) staticPolicies {
	t.Helper()
	return policiesUnder(t, w, 1)
}

// policiesUnder are policies at share of each site's published rate (and
// one request less of its burst): the correctness tests declare a little
// less than a site allows, as a careful team would, so a test machine
// busy enough to delay a request by more than one interval on its way to
// the site cannot make it look like the fleet broke its own budget.
func policiesUnder(t testing.TB, w *web, share float64) staticPolicies {
	t.Helper()
	out := staticPolicies{}
	for _, s := range w.sites {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: w.tls}}
		resp, err := c.Get(s.URL + simweb.RulesPath) //nolint:noctx // a test's one read
		require.NoError(t, err)
		var r simweb.Rules
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
		_ = resp.Body.Close()
		if share < 1 {
			r.RatePerSecond *= share
			r.Burst = max(r.Burst-1, 1)
			r.PerWindow = max(int(float64(r.PerWindow)*share), 1)
		}
		out[s.Host] = policyOf("crawl/"+s.Host, s.Host, r)
	}
	return out
}

// urlsOf are n URLs per site, interleaved.
func urlsOf(w *web, n int) []string {
	var out []string
	for i := range n {
		for _, s := range w.sites {
			out = append(out, s.URL+"/page/"+strconv.Itoa(i))
		}
	}
	return out
}

// oracle is the most pages the sites' rules allow from the web's proxies
// in d, n URLs per site.
func oracle(w *web, d time.Duration, n int) int {
	total := 0
	for _, s := range w.sites {
		total += simweb.Oracle(s.Rules, w.exitIPs(), d, n)
	}
	return total
}

// readItems reads a Scrapy JSON-lines feed: the URLs of its pages.
func readItems(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var item struct{ URL, Body string }
		require.NoError(t, json.Unmarshal([]byte(line), &item))
		if !simweb.IsBlockPage([]byte(item.Body)) && strings.Contains(item.Body, "page /page/") {
			got[item.URL] = true
		}
	}
	return got
}
