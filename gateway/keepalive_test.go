package gateway_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestKeptAliveTunnelsArePacedPerRequest: a client that keeps its tunnel
// alive (Go's net/http, as Scrapy and browsers do) sends request after
// request through it; each request after the first is a turn the gateway
// holds until its slot, so the site never sees more than the declared 2
// requests in any second from the tunnel's IP, over TLS and plain HTTP
// alike, and every request is served. A site slow to finish its TLS
// handshake makes the first request late for its slot: it takes another
// rather than fall closer than the pace to the second.
func TestKeptAliveTunnelsArePacedPerRequest(t *testing.T) {
	const perSecond, requests = 2, 6
	for _, tc := range []struct {
		https         bool
		slowHandshake time.Duration
	}{{true, 0}, {false, 0}, {true, 200 * time.Millisecond}} {
		https := tc.https
		t.Run(fmt.Sprintf("https=%v/handshake=%s", https, tc.slowHandshake), func(t *testing.T) {
			var site string
			f := newFixtureWith(t, gateway.Options{PaceWait: 10 * time.Second}, clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
				o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &site, n: perSecond}}
			})
			s := f.sites[0]
			if !https {
				s = f.plain
			}
			s.handshakeDelay.Store(int64(tc.slowHandshake))
			u, err := url.Parse(s.srv.URL)
			require.NoError(t, err)
			site = u.Hostname()
			tr := &http.Transport{
				Proxy:           http.ProxyURL(f.proxyURL("keepalive")),
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local test site's certificate
				MaxConnsPerHost: 1,
			}
			if !https {
				// Plain HTTP through a proxy is forwarded, not tunnelled:
				// ask for a tunnel as a crawler of HTTP sites through
				// CONNECT would.
				tr.Proxy, tr.DialContext = nil, connectDialer(f.proxyURL("keepalive"))
			}
			c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			opened := testenv.Counter(t, "proxy_operator_gateway_paced_turns_total", map[string]string{"outcome": "sent"})
			late := testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "retaken"})
			for i := range requests {
				resp, err := c.Get(s.srv.URL + fmt.Sprintf("/page-%d", i))
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
			s.mu.Lock()
			at := append([]time.Time(nil), s.at...)
			s.mu.Unlock()
			require.Len(t, at, requests)
			for i := 0; i+perSecond < len(at); i++ {
				assert.GreaterOrEqual(t, at[i+perSecond].Sub(at[i]), time.Second, "%d requests within one second: %v", perSecond+1, at)
			}
			assert.GreaterOrEqual(t, testenv.Counter(t, "proxy_operator_gateway_paced_turns_total", map[string]string{"outcome": "sent"})-opened,
				float64(requests-2), "the requests after the first went as turns of one kept-alive tunnel")
			if tc.slowHandshake > 0 {
				assert.Positive(t, testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "retaken"})-late, "the first request came late for its slot and took another")
			}
		})
	}
}

// lazyPolicy paces *host (set once the site is up) at n requests in any
// window of per (a second when zero) per IP.
type lazyPolicy struct {
	host *string
	n    int
	per  time.Duration
}

func (l lazyPolicy) ForHost(host string) []broker.Policy {
	if host != *l.host {
		return nil
	}
	per := l.per
	if per == 0 {
		per = time.Second
	}
	return []broker.Policy{{Name: "crawl/site", Host: host, Pace: lease.Pace{Interval: lease.WindowPace(l.n, per), Burst: 1}}}
}

// connectDialer dials through the gateway at proxy with a CONNECT of its
// own, as a client that tunnels plain HTTP does.
func connectDialer(proxy *url.URL) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, proxy.Host)
		if err != nil {
			return nil, err
		}
		password, _ := proxy.User.Password()
		auth := base64.StdEncoding.EncodeToString([]byte(proxy.User.Username() + ":" + password))
		if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", addr, addr, auth); err != nil {
			_ = conn.Close()
			return nil, err
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		_ = resp.Body.Close() // a CONNECT's 200 has none
		if resp.StatusCode != http.StatusOK || br.Buffered() > 0 {
			_ = conn.Close()
			return nil, fmt.Errorf("CONNECT %s: %s", addr, resp.Status)
		}
		return conn, nil
	}
}

// TestALateFirstRequestOfASlowPaceStillGoes: at one request in 30s, a
// first request late for its slot (a site slow to finish its handshake)
// finds the pace's next slot beyond --gateway-pace-wait; it goes now, as
// late as it is, rather than have the client's tunnel cut.
func TestALateFirstRequestOfASlowPaceStillGoes(t *testing.T) {
	var site string
	f := newFixtureWith(t, gateway.Options{PaceWait: 2 * time.Second}, clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
		o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &site, n: 1, per: 30 * time.Second}}
	})
	s := f.sites[0]
	site = s.host()
	s.handshakeDelay.Store(int64(200 * time.Millisecond))
	sentLate := testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "sent_late"})
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(f.proxyURL("slow-pace")),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local test site's certificate
	}}
	resp, err := c.Get(s.srv.URL + "/page")
	require.NoError(t, err, "the tunnel is not cut")
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, testenv.Counter(t, "proxy_operator_gateway_late_slots_total", map[string]string{"outcome": "sent_late"})-sentLate,
		"late, and no slot of its own within the pace wait: sent as it was")
}
