package crawlyield

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// gatewayClient is a crawler's client on session through the gateway with
// its own TLS configuration (its fingerprint); proxyStatus keeps the
// Proxy-Status of each CONNECT answer.
func gatewayClient(p *product, session string, tlsConfig *tls.Config, proxyStatus *atomic.Value) *http.Client {
	proxy := &url.URL{Scheme: "http", User: url.UserPassword(session, token), Host: p.gwAddr}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: tlsConfig,
		DisableKeepAlives: true, OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			if proxyStatus != nil {
				proxyStatus.Store(resp.Header.Get("Proxy-Status"))
			}
			return nil
		}}}
}

// TestAClientBanBurnsNoIP: a site blocks one TLS client, by its JA4
// fingerprint, from every IP. A crawler with another TLS configuration
// crawls it through every proxy and reports its pages; a crawler with the
// blocked client reports its 403s on its gateway sessions, as the docs
// say. With a ban policy of a single host, every proxy blocked would be
// banned and its IP burned if the blocks were taken for IP bans; the ban
// judge's decision over the outcome memory bans none and finds the client
// ban. Once it is marked, the blocked client's next tunnel is told so
// (Proxy-Status client_banned), its reports cool no proxy, and the other
// client still gets its pages through every proxy.
func TestAClientBanBurnsNoIP(t *testing.T) {
	const block, proxies = 68, 4
	start := time.Now()
	w := startWeb(t, block, proxies, []simweb.Rules{{Latency: simweb.Duration(5 * time.Millisecond)}}, 0)
	site := w.sites[0]
	store := lease.NewMemoryStore(nil)
	p := startReplica(t, w, broker.Politeness{}, store)

	blockedTLS := w.tls.Clone()
	otherTLS := w.tls.Clone()
	otherTLS.MaxVersion = tls.VersionTLS12
	otherTLS.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305}
	// Each session keeps to one proxy (its id attribute).
	onProxy := func(session string, i int) string { return fmt.Sprintf("%s.id-p%02d", session, i) }
	fetch := func(c *http.Client, session, rawURL string) int {
		resp, err := c.Get(rawURL) //nolint:noctx // a test's crawl
		require.NoError(t, err)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			reportSession(p, session, lease.ResultOK, rawURL, 0)
		case http.StatusForbidden:
			reportSession(p, session, lease.ResultBlocked, rawURL, 0)
		}
		return resp.StatusCode
	}

	// The other client crawls through every proxy.
	for i := range proxies {
		session := fmt.Sprintf("other%d", i)
		c := gatewayClient(p, onProxy(session, i), otherTLS, nil)
		for j := range 3 {
			require.Equal(t, http.StatusOK, fetch(c, session, fmt.Sprintf("%s/page/%s-%d", site.URL, session, j)))
		}
	}
	require.Len(t, site.Clients(), 1)
	other := site.Clients()[0]
	// The site blocks the first client from its first request on.
	resp, err := gatewayClient(p, "probe", blockedTLS, nil).Get(site.URL + "/page/probe") //nolint:noctx // a test's one request
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Len(t, site.Clients(), 2)
	banned := site.Clients()[0]
	if banned == other {
		banned = site.Clients()[1]
	}
	site.BlockClients(banned)
	for i := range proxies {
		session := fmt.Sprintf("blocked%d", i)
		assert.Equal(t, http.StatusForbidden, fetch(gatewayClient(p, onProxy(session, i), blockedTLS, nil), session, site.URL+"/page/"+session))
	}
	assert.Empty(t, site.Stats().Banned, "the site banned no IP")

	// The judge's decision, on a policy that bans a proxy blocked by one
	// host.
	blocks, err := store.Blocks(context.Background(), start)
	require.NoError(t, err)
	require.Len(t, blocks, proxies, "the site blocked the client through every proxy")
	var subjects []bans.Subject
	for i := range proxies {
		subjects = append(subjects, bans.Subject{Key: types.NamespacedName{Namespace: "crawl", Name: fmt.Sprintf("p%02d", i)}, Group: "crawl/bench",
			Hosts: 1, Window: 10 * time.Minute, Since: start.Add(-time.Minute)})
	}
	verdicts, suspects, clientBans := bans.Decide(subjects, blocks, time.Now(), bans.DefaultMaxBlockedShare, nil)
	for key, v := range verdicts {
		assert.False(t, v.Banned, "%s is not banned for the client's blocks (hosts %v)", key, v.Hosts)
	}
	assert.Empty(t, suspects, "nor is the host suspect: the blocks are the client's")
	require.Len(t, clientBans, 1)
	assert.Equal(t, bans.ClientBan{Group: "crawl/bench", Host: site.Host, Client: banned, Blocked: proxies, Passed: proxies,
		Proxies: []string{"crawl/p00", "crawl/p01", "crawl/p02", "crawl/p03"}}, clientBans[0])

	// Marked as the judge marks it: the blocked client's next tunnel is
	// told, its report cools nothing, and the other client is served.
	require.NoError(t, bans.MarkClientBans(context.Background(), store, clientBans, time.Now(), broker.DefaultCooldown))
	var status atomic.Value
	blockedClient := gatewayClient(p, onProxy("blocked0", 0), blockedTLS, &status)
	require.Eventually(t, func() bool {
		return fetch(blockedClient, "blocked0", site.URL+"/page/again") == http.StatusForbidden &&
			strings.Contains(status.Load().(string), gateway.CauseClientBanned)
	}, 10*time.Second, 200*time.Millisecond, "the CONNECT answer says the client is banned")
	assert.Contains(t, status.Load(), banned)
	for i := range proxies {
		var otherStatus atomic.Value
		session := fmt.Sprintf("other%d", i)
		c := gatewayClient(p, onProxy(session, i), otherTLS, &otherStatus)
		assert.Equal(t, http.StatusOK, fetch(c, session, site.URL+"/page/other-again"), "no cooldown keeps the other client off %d", i)
		assert.NotContains(t, otherStatus.Load(), gateway.CauseClientBanned, "the other client is not told")
	}
}
