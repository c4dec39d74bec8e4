package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/test/squid"
)

// freePort returns a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// tlsTarget is a local HTTPS server answering status; its CA is returned for
// the prober to trust.
func tlsTarget(t *testing.T, status int) (string, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv.URL + "/generate_204", pool
}

// blackHole accepts connections and never answers.
func blackHole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestProbeThroughRealSquid probes through Debian's squid: only a proxy that
// really carries a TLS request to the target passes.
func TestProbeThroughRealSquid(t *testing.T) {
	target, roots := tlsTarget(t, http.StatusNoContent)
	failingTarget, failingRoots := tlsTarget(t, http.StatusInternalServerError)
	healthy := squid.Start(t, squid.Config{Address: "127.0.0.1", Port: freePort(t)})
	denying := squid.Start(t, squid.Config{Address: "127.0.0.1", Port: freePort(t), Rules: squid.DenyConnectRules})
	downTarget := "https://127.0.0.1:" + strconv.Itoa(freePort(t)) + "/"
	closed := "127.0.0.1:" + strconv.Itoa(freePort(t))
	ctx := context.Background()

	cases := []struct {
		name       string
		prober     *HTTPProber
		proxy, url string
		timeout    time.Duration
		want       string
	}{
		{"healthy squid", NewHTTPProber(roots), healthy.Addr, target, 5 * time.Second, ReasonProbeSucceeded},
		{"squid denies CONNECT", NewHTTPProber(roots), denying.Addr, target, 5 * time.Second, ReasonProxyRefusedConnect},
		{"squid up, target down", NewHTTPProber(roots), healthy.Addr, downTarget, 5 * time.Second, ReasonTunnelFailed},
		{"a listener that never answers", NewHTTPProber(roots), blackHole(t), target, 300 * time.Millisecond, ReasonTimeout},
		{"nothing listening", NewHTTPProber(roots), closed, target, 5 * time.Second, ReasonConnectRefused},
		{"target answers 500", NewHTTPProber(failingRoots), healthy.Addr, failingTarget, 5 * time.Second, ReasonBadStatus},
		{"target's certificate not trusted", NewHTTPProber(x509.NewCertPool()), healthy.Addr, target, 5 * time.Second, ReasonTLSError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.prober.Probe(ctx, ProbeRequest{ProxyAddr: tc.proxy, Target: tc.url, Timeout: tc.timeout})
			assert.Equal(t, tc.want, got.Reason, "message: %s", got.Message)
			assert.Equal(t, tc.want == ReasonProbeSucceeded, got.Success)
			assert.NotEmpty(t, got.Message)
		})
	}
}

// TestProbesResumeTLSWithoutPostQuantumKeyShares: a fleet's probes of one
// target, through different proxies, resume the prober's TLS session after
// the first full handshake, and offer X25519 rather than the hybrid ML-KEM
// exchange; a target whose certificate is not trusted still fails a probe
// whatever sessions the prober holds for others.
func TestProbesResumeTLSWithoutPostQuantumKeyShares(t *testing.T) {
	var mu sync.Mutex
	var resumed []bool
	var offered [][]tls.CurveID
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		resumed = append(resumed, r.TLS.DidResume)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.TLS = &tls.Config{GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		mu.Lock()
		offered = append(offered, hello.SupportedCurves)
		mu.Unlock()
		return nil, nil
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	target := srv.URL + "/generate_204"
	proxies := []string{
		squid.Start(t, squid.Config{Address: "127.0.0.1", Port: freePort(t)}).Addr,
		squid.Start(t, squid.Config{Address: "127.0.0.1", Port: freePort(t)}).Addr,
	}

	prober := NewHTTPProber(roots)
	for i := range 4 {
		got := prober.Probe(context.Background(), ProbeRequest{ProxyAddr: proxies[i%2], Target: target, Timeout: 5 * time.Second})
		require.True(t, got.Success, "probe %d: %s", i, got.Message)
	}
	mu.Lock()
	assert.Equal(t, []bool{false, true, true, true}, resumed, "one full handshake, then resumed through either proxy")
	for _, curves := range offered {
		assert.Contains(t, curves, tls.X25519)
		assert.NotContains(t, curves, tls.X25519MLKEM768)
	}
	mu.Unlock()

	untrusted := NewHTTPProber(x509.NewCertPool())
	got := untrusted.Probe(context.Background(), ProbeRequest{ProxyAddr: proxies[0], Target: target, Timeout: 5 * time.Second})
	assert.Equal(t, ReasonTLSError, got.Reason, "message: %s", got.Message)
}
