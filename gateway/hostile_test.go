package gateway_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/squid"
)

// productionRules are the Managed proxies' own refusals (squidconf): a
// CONNECT to port 443 only, and a denied destination.
const productionRules = `acl SSL_ports port 443
acl denied_destinations dst 127.0.0.99/32
acl CONNECT method CONNECT
http_access deny denied_destinations
http_access deny CONNECT !SSL_ports
http_access allow localhost
http_access deny all
`

// Attack: anyone who can reach the gateway has the fleet's Squids refuse
// made-up destinations, hoping each 403 is taken for a site's block and
// bans the proxies. The gateway here lets every port through, so the
// requests reach the Squids, which refuse them themselves.
func TestSquidsOwnRefusalsBanNobody(t *testing.T) {
	f := newFixtureWith(t, gateway.Options{Destinations: gateway.Destinations{ConnectPorts: []int{0}, HTTPPorts: []int{0}}},
		clock.RealClock{}, productionRules, nil)
	for _, target := range []string{"x1.example:8443", "x2.example:8443", "x3.example:8443", "x4.example:8443"} {
		resp := rawConnect(t, f.gwAddr, target, basic("", token))
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "every proxy refused %s", target)
	}
	cl, _ := f.client("")
	resp, err := cl.Get("http://127.0.0.99/admin")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "Squid's own 403, relayed")
	require.NotEmpty(t, resp.Header.Get("X-Squid-Error"), "Squid marks it as its own")

	blocks, err := f.server.Outcomes().Blocks(context.Background(), time.Time{})
	require.NoError(t, err)
	assert.Empty(t, blocks, "a proxy's own refusal is no site's block: nothing for the ban judge")
	for _, id := range f.proxies {
		records, err := f.server.Outcomes().Outcomes(context.Background(), id)
		require.NoError(t, err)
		assert.Empty(t, records, "%s: no outcome at all", id)
	}
}

// The gateway refuses, before it picks a proxy, what no proxy would carry:
// a port the Managed proxies refuse, a denied address. No upstream is
// asked (the answer names none), and the client reads why.
func TestTheGatewayRefusesWhatNoProxyWouldCarry(t *testing.T) {
	f := newFixture(t, gateway.Options{Destinations: gateway.Destinations{
		ConnectPorts: gateway.DefaultConnectPorts, HTTPPorts: gateway.DefaultHTTPPorts, Denied: []netip.Prefix{netip.MustParsePrefix("127.0.0.96/29")},
	}})
	for _, tc := range []struct {
		target, errType string
	}{
		{"x1.example:8443", "http_request_denied"},
		{"127.0.0.99:443", "destination_ip_prohibited"},
		{"[::ffff:127.0.0.99]:443", "destination_ip_prohibited"},
	} {
		before := errorsCounted(t, tc.errType, gateway.CauseDestination)
		resp := rawConnect(t, f.gwAddr, tc.target, basic("", token))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, tc.target)
		assert.Regexp(t, `^egress-proxies-operator; error=`+tc.errType+`; details="destination_denied: `, resp.Header.Get("Proxy-Status"), tc.target)
		assert.Empty(t, resp.Header.Get(gateway.HeaderUpstream), "no upstream asked for %s", tc.target)
		assert.Equal(t, before+1, errorsCounted(t, tc.errType, gateway.CauseDestination))
	}
	cl, _ := f.client("")
	resp, err := cl.Get("http://shop.example:8080/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "plain HTTP to a port the proxies refuse")
	unauth := rawConnect(t, f.gwAddr, "x1.example:8443", "")
	assert.Equal(t, http.StatusProxyAuthRequired, unauth.StatusCode, "a stranger learns nothing of the rules")
}

// withTeamQuota gives the team of oneTeam ("team-token") a TenantQuota of
// bytesPerDay gateway bytes.
func withTeamQuota(bytesPerDay int64) func(*discovery.Options) {
	return func(o *discovery.Options) {
		quotas := broker.NewQuotaIndex()
		quotas.Handler().OnAdd(&crawlv1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl-a", Name: "crawler"},
			Spec: crawlv1alpha1.TenantQuotaSpec{GatewayBytesPerDay: resource.NewQuantity(bytesPerDay, resource.BinarySI)}}, false)
		o.Tenants, o.Quotas = oneTeam{}, quotas
	}
}

// clientAs is a keep-alive Go client of the gateway with password.
func (f *fixture) clientAs(username, password string) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(username, password), Host: f.gwAddr}),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local test site's certificate
	}}
}

// Attack: a team with a bytes-per-day quota downloads far more than it
// inside one long tunnel, which used to count only at its end. The tunnel
// is cut once the day's bytes are spent (within one buffer), its next
// tunnel is refused, and the platform's crawl goes on untouched.
func TestABytesQuotaCutsATunnelInFlight(t *testing.T) {
	const quota = 256 << 10
	f := newFixtureWith(t, gateway.Options{}, clock.RealClock{}, squid.DefaultRules, withTeamQuota(quota))
	site := "https://" + f.sites[0].srv.Listener.Addr().String()
	team := f.clientAs("s1", "team-token")

	resp, err := team.Get(site + "/big/" + strconv.Itoa(16<<20))
	require.NoError(t, err, "the tunnel opens: the day's bytes are not spent yet")
	got, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Error(t, err, "the tunnel is cut mid-body")
	assert.Less(t, got, int64(quota+4*32<<10), "at most the quota and a few buffers")
	t.Logf("the team read %d bytes of its %d-byte quota before the cut", got, quota)

	next, err := team.Get(site + "/hello")
	if err == nil {
		_ = next.Body.Close()
	}
	require.Error(t, err, "the next tunnel is refused")
	assert.Contains(t, err.Error(), "Too Many Requests")

	platform := f.clientAs("", token)
	resp, err = platform.Get(site + "/big/" + strconv.Itoa(4<<20))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, int64(4<<20), n, "another tenant is not bound by it")
}

// A tunnel whose lease ran out (its renewals failed for a whole TTL) is
// closed: a tunnel no lease counts would escape its tenant's maxTunnels.
func TestATunnelWhoseLeaseRanOutIsClosed(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	f := newFixtureOn(t, gateway.Options{}, clk)
	// A gateway of its own, started: its renew loop runs.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	gw := gateway.New(gateway.Options{Addr: addr, Upstreams: f.server.Tunnels(), LeaseTTL: 300 * time.Millisecond,
		Destinations: gateway.Destinations{ConnectPorts: []int{0}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)

	g := *f
	g.gwAddr = addr
	tun := g.openTunnel(t, "s1", f.sites[0].srv.Listener.Addr().String())
	clk.Step(time.Hour) // the store's clock: every lease expired at once
	_ = tun.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = tun.conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the gateway closed the tunnel")
}
