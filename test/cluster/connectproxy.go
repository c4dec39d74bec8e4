package cluster

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// ConnectProxy is a minimal in-process HTTP CONNECT proxy on a loopback
// address: what the benchmarks put behind thousands of Proxies, where as
// many Squid processes would not fit on one machine. It tunnels to any
// address; tests only ever point it at loopback targets.
type ConnectProxy struct {
	// Addr is host:port it listens on.
	Addr string

	srv  *http.Server
	once sync.Once
}

// StartConnectProxy listens on addr ("127.0.0.1:0" for any free port).
func StartConnectProxy(addr string) (*ConnectProxy, error) {
	return StartAuthenticatingProxy(addr, nil)
}

// StartAuthenticatingProxy is StartConnectProxy answering 407 to a CONNECT
// whose Basic credentials authorize rejects, as a Managed proxy's Squid
// does; a nil authorize admits everyone.
func StartAuthenticatingProxy(addr string, authorize func(user, password string) bool) (*ConnectProxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect proxy on %s: %w", addr, err)
	}
	p := &ConnectProxy{Addr: l.Addr().String()}
	// Tunnels leave from the proxy's own address, as a pod's would.
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: l.Addr().(*net.TCPAddr).IP}}
	tunnel := func(w http.ResponseWriter, r *http.Request) { tunnelFrom(dialer, w, r) }
	handler := http.HandlerFunc(tunnel)
	if authorize != nil {
		handler = func(w http.ResponseWriter, r *http.Request) {
			user, password, ok := proxyBasicAuth(r)
			if !ok || !authorize(user, password) {
				w.Header().Set("Proxy-Authenticate", `Basic realm="egress-proxy"`)
				http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
				return
			}
			tunnel(w, r)
		}
	}
	p.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: handler}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// FreeAddr is a loopback host:port free at the time of the call, for a
// process that must be told its address before it listens. It panics if
// the machine cannot listen on loopback at all: nothing else would work.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("listening on loopback: %v", err))
	}
	defer l.Close()
	return l.Addr().String()
}

// LoopbackIP is the nth address of a loopback block 127.<block>.x.y, 250
// to an x: distinct for each n, so each pod (or fake host) gets an address
// of its own, as a node gives each pod one.
func LoopbackIP(block, n int) string {
	return fmt.Sprintf("127.%d.%d.%d", block, n/250, 1+n%250)
}

// Close stops listening: from then on the proxy refuses connections, as a
// crashed Squid does.
func (p *ConnectProxy) Close() {
	p.once.Do(func() { _ = p.srv.Close() })
}

func tunnelFrom(dialer *net.Dialer, w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	dst, err := dialer.DialContext(r.Context(), "tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		_ = dst.Close()
		return
	}
	_, _ = conn.Write([]byte("HTTP/1.1 200 Connection Established\r\n\r\n"))
	go func() { _, _ = io.Copy(dst, conn); _ = dst.Close() }()
	_, _ = io.Copy(conn, dst)
	_ = conn.Close()
}

// proxyBasicAuth reads Proxy-Authorization as net/http reads Authorization.
func proxyBasicAuth(r *http.Request) (string, string, bool) {
	probe := &http.Request{Header: http.Header{"Authorization": r.Header.Values("Proxy-Authorization")}}
	return probe.BasicAuth()
}
