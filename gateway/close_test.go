package gateway_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestATunnelTheClientResetsEndsDone: a crawler that resets its tunnel
// once its answer came, as many HTTP clients close a connection with a
// TLS ticket still unread, has ended it "done", not "error": the reason is
// what the tunnels_closed metric and the tunnel's span tell an operator
// looking for failing upstreams.
func TestATunnelTheClientResetsEndsDone(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	closed := func(reason string) float64 {
		return testenv.Counter(t, "proxy_operator_gateway_tunnels_closed_total", map[string]string{"reason": reason})
	}
	done, failed := closed("done"), closed("error")

	target := f.sites[0].srv.Listener.Addr().String()
	tun := f.openTunnel(t, "resetter", target)
	site := tls.Client(tun.conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the local test site's certificate
	req, err := http.NewRequest(http.MethodGet, "https://"+target+"/page", nil)
	require.NoError(t, err)
	require.NoError(t, req.Write(site))
	resp, err := http.ReadResponse(bufio.NewReader(site), req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.NoError(t, tun.conn.(*net.TCPConn).SetLinger(0))
	require.NoError(t, tun.conn.Close(), "a reset, not a FIN")
	require.Eventually(t, func() bool { return f.gw.Open() == 0 }, 10*time.Second, 10*time.Millisecond, "the tunnel closed")
	assert.Equal(t, done+1, closed("done"))
	assert.Equal(t, failed, closed("error"))
}
