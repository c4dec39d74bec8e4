package gateway

// The inspecting mode: a tunnel whose username asks for it (-inspect) is
// not spliced. The gateway answers the CONNECT itself, speaks TLS to the
// client with a certificate for the host minted from the tenant's own CA
// (package inspect), and carries each request the client sends (HTTP/1.1
// kept alive, or HTTP/2 multiplexed) as the plain-HTTP path carries one:
// a lease and a pace slot of its own, the site's answer judged and
// recorded, an idempotent request the site refused the IP tried once more
// on another. The site sees the gateway's TLS client, not the crawler's.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/inspect"
)

// Inspect configures the inspecting mode; a nil Authority turns it off,
// and a client that asks for it is told so.
type Inspect struct {
	// On is --gateway-inspect: the operator then keeps each tenant's CA
	// (inspect.Secrets) and sets Authority.
	On bool
	// RootCAsFile is --gateway-inspect-root-cas: a PEM file of CAs the
	// sites' certificates may chain to, besides the system's.
	RootCAsFile string
	// Authority is each tenant's CA.
	Authority inspect.Authority
	// RootCAs verify the sites' certificates (nil: the system's).
	RootCAs *x509.CertPool
}

// LoadRootCAs reads RootCAsFile into RootCAs (the system's pool and the
// file's CAs); nothing to do without a file.
func (i *Inspect) LoadRootCAs() error {
	if i.RootCAsFile == "" {
		return nil
	}
	pemBytes, err := os.ReadFile(i.RootCAsFile)
	if err != nil {
		return fmt.Errorf("--gateway-inspect-root-cas: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return fmt.Errorf("--gateway-inspect-root-cas: %s holds no PEM certificate", i.RootCAsFile)
	}
	i.RootCAs = pool
	return nil
}

// Enabled says whether the gateway inspects the tunnels that ask.
func (i Inspect) Enabled() bool { return i.Authority != nil }

// inspectTransport is the transport of inspected requests: the plain-HTTP
// forwarder's (through the picked upstream, upstreamOf), speaking HTTPS to
// the sites over HTTP/1.1 kept alive, so that each request has a
// connection of its own when it is held for its slot (slotGate); the
// client's side may multiplex over HTTP/2.
func inspectTransport(forwarder *http.Transport, opts Options) *http.Transport {
	t := forwarder.Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: opts.Inspect.RootCAs, MinVersion: tls.VersionTLS12}
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	t.TLSHandshakeTimeout = opts.ConnectTimeout
	return t
}

// inspectTunnel serves a CONNECT that asked to be inspected.
func (g *Gateway) inspectTunnel(w http.ResponseWriter, r *http.Request, id Identity, hostport string) {
	ctx := r.Context()
	if !g.opts.Inspect.Enabled() {
		answer{status: http.StatusBadRequest, errType: psHTTPRequestError, cause: CauseInspectOff,
			msg: "this gateway does not inspect tunnels (the operator runs without --gateway-inspect): drop -inspect from the username"}.write(w, r)
		return
	}
	ca, err := g.opts.Inspect.Authority.CA(ctx, id.Tenant)
	if err != nil {
		logf.FromContext(ctx).Error(err, "reading a tenant's inspecting CA", "tenant", id.Tenant.Name)
		answer{status: http.StatusServiceUnavailable, errType: psProxyInternalError, cause: CauseInspectUnavailable, retryAfter: 5 * time.Second,
			msg: "the tenant's inspecting CA cannot be read now; retry"}.write(w, r)
		return
	}
	if !g.takeSlot(ctx) {
		g.busy(w, r)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		g.freeSlot()
		http.Error(w, "the connection cannot be hijacked", http.StatusInternalServerError)
		return
	}
	clientConn, brw, err := hj.Hijack()
	if err != nil {
		g.freeSlot()
		logf.FromContext(ctx).Error(err, "hijacking a CONNECT")
		return
	}
	_ = clientConn.SetDeadline(time.Time{})
	if _, err := io.WriteString(clientConn, "HTTP/1.1 200 Connection established\r\nProxy-Status: "+ProxyStatusName+
		"; details="+sfString(CauseInspecting+": the gateway terminates this tunnel's TLS with the tenant's inspecting CA")+"\r\n\r\n"); err != nil {
		_ = clientConn.Close()
		g.freeSlot()
		return
	}
	requestsTotal.WithLabelValues(kindInspect, outcomeOK).Inc()
	host, _, _ := net.SplitHostPort(hostport)
	conn := tls.Server(&bufferedConn{Conn: clientConn, r: brw.Reader}, &tls.Config{
		MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The certificate is for the host the CONNECT named: a client
			// naming another in its SNI gets one it will not trust.
			return g.minter.Leaf(ca, host, time.Now())
		},
	})
	t := &tunnel{session: broker.SessionKey(id.Tenant, id.Session), name: id.Session, host: broker.NormalizeTarget(host), client: conn, upstr: conn,
		started: time.Now(), idle: g.opts.IdleTimeout, life: g.opts.MaxTunnelLifetime, who: id.Tenant, inspected: true}
	t.touch()
	g.register(t)
	bg := logf.IntoContext(context.Background(), logf.FromContext(ctx))
	go func() {
		defer g.freeSlot()
		defer g.unregister(t)
		g.serveInspected(bg, t, id, hostport)
		tunnelsClosed.WithLabelValues(t.reason).Inc()
		tunnelDuration.Observe(time.Since(t.started).Seconds())
	}()
}

// serveInspected serves the requests of an inspected client connection
// until it closes, is idle for IdleTimeout or reaches MaxTunnelLifetime.
func (g *Gateway) serveInspected(ctx context.Context, t *tunnel, id Identity, hostport string) {
	lis := newOneConn(t.client)
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       g.opts.IdleTimeout,
		MaxHeaderBytes:    32 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				lis.done()
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t.touch()
			out := r.Clone(r.Context())
			out.RequestURI = ""
			out.URL = &url.URL{Scheme: "https", Host: hostport, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
			out.Host = hostport
			g.carryRequest(w, r, out, id, g.inspector, true)
			t.touch()
		}),
	}
	life := time.AfterFunc(t.life, func() { t.close(closedLifetime) })
	defer life.Stop()
	_ = srv.Serve(lis)
	t.close(closedDone)
}

// bufferedConn is a connection whose first bytes are in r (what the
// CONNECT's reader took early: a ClientHello).
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r != nil && c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	c.r = nil
	return c.Conn.Read(p)
}

// oneConn is a listener that accepts one connection, then waits until it
// is done.
type oneConn struct {
	conn   net.Conn
	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
	taken  bool
}

func newOneConn(c net.Conn) *oneConn { return &oneConn{conn: c, closed: make(chan struct{})} }

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.taken {
		l.taken = true
		l.mu.Unlock()
		return l.conn, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConn) done()          { l.once.Do(func() { close(l.closed) }) }
func (l *oneConn) Close() error   { l.done(); return nil }
func (l *oneConn) Addr() net.Addr { return l.conn.LocalAddr() }
