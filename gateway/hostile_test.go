package gateway_test

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/gateway"
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
		clock.RealClock{}, productionRules)
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
