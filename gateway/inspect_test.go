package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// inspectFixture is the fixture with the inspecting mode on: one CA for
// every tenant, and the sites' certificates (the fixture's, and
// otherSites') trusted by the gateway.
func inspectFixture(t *testing.T, policy func(o *discovery.Options), otherSites ...*x509.Certificate) (*fixture, *x509.CertPool) {
	t.Helper()
	ca, err := inspect.NewCA("test inspecting CA", time.Now())
	require.NoError(t, err)
	sitesCAs := x509.NewCertPool()
	authority := inspect.Static{Cert: &ca}
	f := newFixtureWith(t, gateway.Options{PaceWait: 10 * time.Second, Inspect: gateway.Inspect{Authority: authority, RootCAs: sitesCAs}},
		clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
			o.InspectCA = authority
			if policy != nil {
				policy(o)
			}
		})
	for _, s := range f.sites {
		sitesCAs.AddCert(s.srv.Certificate())
	}
	for _, c := range otherSites {
		sitesCAs.AddCert(c)
	}
	// The crawler trusts what GET /v1/inspect/ca hands its tenant.
	req, err := http.NewRequest(http.MethodGet, f.api.URL+"/v1/inspect/ca", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	pemBytes, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", pemBytes)
	trusted := x509.NewCertPool()
	require.True(t, trusted.AppendCertsFromPEM(pemBytes), "the API hands a PEM certificate")
	return f, trusted
}

// inspectedClient is a crawler on the gateway as username, trusting
// roots, over HTTP/2 when h2 (else HTTP/1.1 kept alive), one connection.
func inspectedClient(f *fixture, username string, roots *x509.CertPool, h2 bool) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(f.proxyURL(username)), TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: h2, MaxConnsPerHost: 1,
	}}
}

// TestInspectedRequestsArePacedOneByOne: a team that opts into the
// inspecting mode (-inspect) and trusts its CA sends requests over one
// kept-alive HTTP/1.1 connection, or all at once multiplexed over one
// HTTP/2 connection as browsers do; the gateway sees each request, so the
// site never gets more than the declared 2 in any second from any IP, and
// every one is served, through a certificate of the team's CA. A site slow
// to finish its TLS handshake makes a request on a new connection late for
// its slot: it takes another rather than fall closer than the pace to the
// next.
func TestInspectedRequestsArePacedOneByOne(t *testing.T) {
	const perSecond, requests = 2, 6
	for _, tc := range []struct {
		h2            bool
		slowHandshake time.Duration
	}{{false, 0}, {true, 0}, {true, 200 * time.Millisecond}} {
		h2 := tc.h2
		t.Run(fmt.Sprintf("h2=%v/handshake=%s", h2, tc.slowHandshake), func(t *testing.T) {
			var host string
			f, roots := inspectFixture(t, func(o *discovery.Options) {
				o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &host, n: perSecond}}
			})
			s := f.sites[0]
			host = s.host()
			s.handshakeDelay.Store(int64(tc.slowHandshake))
			late := testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "retaken"})
			c := inspectedClient(f, "crawler-1.inspect", roots, h2)
			var wg sync.WaitGroup
			for i := range requests {
				wg.Go(func() {
					resp, err := c.Get(fmt.Sprintf("%s/page-%d", s.srv.URL, i))
					if !assert.NoError(t, err) {
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					assert.Equal(t, http.StatusOK, resp.StatusCode)
					assert.Equal(t, "test inspecting CA", resp.TLS.PeerCertificates[0].Issuer.CommonName, "the gateway's certificate, of the team's CA")
					if h2 {
						assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2 between the crawler and the gateway")
					}
				})
				if !h2 {
					wg.Wait() // HTTP/1.1 on one connection: one at a time
				}
			}
			wg.Wait()
			s.mu.Lock()
			at, seen := append([]time.Time(nil), s.at...), append([]string(nil), s.seen...)
			s.mu.Unlock()
			require.Len(t, at, requests)
			byUpstream := map[string][]time.Time{}
			for i, up := range seen {
				byUpstream[up] = append(byUpstream[up], at[i])
			}
			for up, at := range byUpstream {
				for i := 0; i+perSecond < len(at); i++ {
					assert.GreaterOrEqual(t, at[i+perSecond].Sub(at[i]), time.Second, "%d requests from %s within one second: %v", perSecond+1, up, at)
				}
			}
			if tc.slowHandshake > 0 {
				assert.Positive(t, testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "retaken"})-late, "a request came late for its slot and took another")
			}
		})
	}
}

// TestInspectedRefusalsAreRecordedAndRetried: the gateway reads the site's
// answers to inspected requests. A 429 with Retry-After is recorded and
// cools the proxy for the host for every crawler, though no crawler
// reported it; an idempotent GET the site refused the IP (403) is tried
// once more on another IP, and the crawler gets the page.
func TestInspectedRefusalsAreRecordedAndRetried(t *testing.T) {
	f, roots := inspectFixture(t, nil)
	ctx := context.Background()

	limitedSite := f.sites[0]
	limitedSite.limitFirst = true
	c := inspectedClient(f, "crawler-1.inspect", roots, false)
	status, _ := get(t, c, limitedSite.srv.URL+"/one")
	require.Equal(t, http.StatusTooManyRequests, status, "a push-back goes back to the crawler as the site said it")
	limited := limitedSite.upstreams()[0]
	records, err := f.server.Outcomes().Outcomes(ctx, limited)
	require.NoError(t, err)
	require.Len(t, records, 1)
	assert.Positive(t, records[0].Blocked, "recorded without a report")
	assert.True(t, records[0].LastBlocked.IsZero(), "a push-back, not a block")
	for i := range 4 {
		other := inspectedClient(f, fmt.Sprintf("crawler-%d.inspect", i+2), roots, false)
		status, _ := get(t, other, limitedSite.srv.URL+"/two")
		assert.Equal(t, http.StatusOK, status)
	}
	assert.NotContains(t, limitedSite.upstreams()[1:], limited, "its Retry-After keeps the proxy away from the host for everyone")

	bannedSite := f.sites[1]
	bannedSite.forbidFirst = true
	retries := testenv.Counter(t, "proxy_operator_gateway_inspect_retries_total", nil)
	status, body := get(t, inspectedClient(f, ".inspect", roots, false), bannedSite.srv.URL+"/page")
	assert.Equal(t, http.StatusOK, status, "the GET refused the IP was tried once more on another: %s", body)
	seen := bannedSite.upstreams()
	require.Len(t, seen, 2)
	assert.NotEqual(t, seen[0], seen[1])
	assert.Equal(t, float64(1), testenv.Counter(t, "proxy_operator_gateway_inspect_retries_total", nil)-retries)
	records, err = f.server.Outcomes().Outcomes(ctx, seen[0])
	require.NoError(t, err)
	blocked := false
	for _, r := range records {
		blocked = blocked || (r.Host == bannedSite.host() && !r.LastBlocked.IsZero())
	}
	assert.True(t, blocked, "the 403 is a block of that proxy by the host: %v", records)
}

// TestInspectingIsNeverTheDefault: without -inspect a tunnel is spliced
// (the crawler sees the site's own certificate), and a gateway without
// --gateway-inspect refuses -inspect with a reason.
func TestInspectingIsNeverTheDefault(t *testing.T) {
	f, _ := inspectFixture(t, nil)
	c, _ := f.client("crawler-1")
	resp, err := c.Get(f.sites[0].srv.URL + "/page") //nolint:noctx // a test's request
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, f.sites[0].srv.Certificate().Raw, resp.TLS.PeerCertificates[0].Raw, "the site's own certificate")

	off := newFixture(t, gateway.Options{})
	a := rawConnect(t, off.gwAddr, f.sites[0].host()+":443", basic("crawler-1.inspect", token))
	assert.Equal(t, http.StatusBadRequest, a.StatusCode)
	assert.Contains(t, a.Header.Get("Proxy-Status"), gateway.CauseInspectOff)

	req, err := http.NewRequest(http.MethodGet, off.api.URL+"/v1/inspect/ca", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	caResp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = caResp.Body.Close()
	assert.Equal(t, http.StatusNotFound, caResp.StatusCode)
}
