package health

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/intern"
)

// Reasons a probe fails, as they appear in the Healthy condition and the
// proxy_operator_healthcheck_total metric.
const (
	// ReasonProbeSucceeded is the Healthy condition's reason when probes pass.
	ReasonProbeSucceeded = "ProbeSucceeded"
	// ReasonConnectRefused: nothing listens on the proxy's address.
	ReasonConnectRefused = "ConnectRefused"
	// ReasonProxyRefusedConnect: the proxy answered CONNECT with 403 or 407.
	ReasonProxyRefusedConnect = "ProxyRefusedConnect"
	// ReasonTunnelFailed: the proxy could not open the tunnel (502, 503...),
	// or the tunnel broke.
	ReasonTunnelFailed = "TunnelFailed"
	// ReasonTLSError: the TLS handshake with the target through the tunnel
	// failed.
	ReasonTLSError = "TLSError"
	// ReasonTimeout: no answer within the probe timeout.
	ReasonTimeout = "Timeout"
	// ReasonBadStatus: the target answered with an error status.
	ReasonBadStatus = "BadStatus"
	// ReasonProxyAuthRejected: the proxy answered CONNECT with 407 though
	// the probe presented the proxy's credentials (wrong, or signed with a
	// key the proxy does not hold).
	ReasonProxyAuthRejected = "ProxyAuthRejected"
	// ReasonOpenProxy: the proxy tunnelled a CONNECT that carried no
	// credentials. Anyone who can reach it can use it: it is never leased.
	ReasonOpenProxy = "OpenProxy"
	// ReasonCredentialsUnavailable: the proxy's credentials could not be
	// read, so it could not be probed as a crawler would use it.
	ReasonCredentialsUnavailable = "CredentialsUnavailable"
)

// Result is the outcome of one probe.
type Result struct {
	// Success is true when the target answered with a non-error status.
	Success bool
	// Reason is ReasonProbeSucceeded or the failure's reason.
	Reason string
	// Message says what happened, for the condition.
	Message string
	// EgressIP is the address the echo URL saw the probe come from (""
	// when not asked, or it could not tell).
	EgressIP string
}

// ProbeRequest is one probe of one proxy.
type ProbeRequest struct {
	// ProxyAddr is the proxy's host:port; Target the URL fetched through it
	// within Timeout.
	ProxyAddr, Target string
	Timeout           time.Duration
	// Credentials are presented to the proxy (Proxy-Authorization); zero
	// for a proxy that takes none.
	Credentials credentials.Credentials
	// CheckOpen first sends a CONNECT without credentials: a proxy that
	// tunnels it fails the probe with ReasonOpenProxy.
	CheckOpen bool
	// EchoURL, when set, is fetched through the proxy after a probe that
	// passed, to learn the address sites see (Result.EgressIP).
	EchoURL string
}

// Prober fetches a URL through a proxy.
type Prober interface {
	// Probe performs req.
	Probe(ctx context.Context, req ProbeRequest) Result
}

// HTTPProber is the real probe: an HTTPS GET through the proxy, so a CONNECT
// tunnel, TLS to the target through it and a non-error status from the
// target. A proxy that accepts TCP but cannot egress fails it.
type HTTPProber struct {
	transport *http.Transport
}

type proxyAddrKey struct{}

type proxyAuthKey struct{}

// connectStatusError carries the proxy's answer to CONNECT.
type connectStatusError struct{ status int }

func (e *connectStatusError) Error() string {
	return fmt.Sprintf("proxy answered CONNECT with %d %s", e.status, http.StatusText(e.status))
}

// probeSessions is how many targets' TLS sessions the prober keeps to
// resume: one per probe URL in use is plenty.
const probeSessions = 64

// probeCurves are the key exchanges a probe offers: X25519, and P-256 for a
// target without it. The probe's TLS carries nothing secret (a GET of a
// public URL, the proxy's credentials having gone on the CONNECT before
// it), so the hybrid post-quantum exchange Go offers by default would cost
// every probe its ML-KEM key generation, the largest part of a handshake,
// and protect nothing.
var probeCurves = []tls.CurveID{tls.X25519, tls.CurveP256}

// probeTLSConfig is how a probe speaks TLS to its target through the
// tunnel: roots, TLS 1.2 at least, probeCurves, and one session cache for
// every proxy. The benchmark's bare loop uses it too, so its baseline is
// the same handshake the engine makes.
func probeTLSConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, CurvePreferences: probeCurves,
		ClientSessionCache: tls.NewLRUClientSessionCache(probeSessions)}
}

// NewHTTPProber builds a prober trusting roots (nil: the system roots). One
// transport serves every proxy: the proxy is chosen per request, and
// keep-alives are off so every probe opens a fresh tunnel. Its TLS sessions
// with a target are resumed across probes and proxies: a resumed handshake
// still needs the target's keys (a proxy that intercepts TLS cannot resume
// a session it never saw, and its own certificate fails verification), but
// skips sending and checking the certificate chain each time.
func NewHTTPProber(roots *x509.CertPool) *HTTPProber {
	t := &http.Transport{
		Proxy: func(req *http.Request) (*url.URL, error) {
			addr, _ := req.Context().Value(proxyAddrKey{}).(string)
			if addr == "" {
				return nil, errors.New("probe without a proxy address")
			}
			auth, _ := req.Context().Value(proxyAuthKey{}).(*url.Userinfo)
			// With userinfo, the transport sends Proxy-Authorization on CONNECT.
			return &url.URL{Scheme: "http", Host: addr, User: auth}, nil
		},
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode != http.StatusOK {
				return &connectStatusError{status: res.StatusCode}
			}
			return nil
		},
		DialContext:         (&net.Dialer{}).DialContext,
		TLSClientConfig:     probeTLSConfig(roots),
		DisableKeepAlives:   true,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: -1,
	}
	return &HTTPProber{transport: t}
}

// Probe performs one probe: the open-proxy check if asked, then the fetch
// with the proxy's credentials.
func (p *HTTPProber) Probe(ctx context.Context, pr ProbeRequest) Result {
	target := pr.Target
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, proxyAddrKey{}, pr.ProxyAddr), pr.Timeout)
	defer cancel()
	if pr.CheckOpen {
		if open, msg := tunnelsWithoutCredentials(ctx, pr.ProxyAddr, target); open {
			return Result{Reason: ReasonOpenProxy, Message: msg}
		}
	}
	ctx = context.WithValue(ctx, proxyAuthKey{}, pr.Credentials.Userinfo())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return Result{Reason: ReasonBadStatus, Message: fmt.Sprintf("probe URL %q: %v", target, err)}
	}
	req.Header.Set("User-Agent", "egress-proxies-operator-health/1")
	res, err := p.transport.RoundTrip(req)
	if err != nil {
		return classify(ctx, err)
	}
	defer res.Body.Close()
	// Drain a little so the target sees a complete exchange.
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	// Interned: the engine keeps every proxy's last result, and a fleet's
	// answers from one target read the same.
	message := intern.String(fmt.Sprintf("%s answered %s through the proxy", target, res.Status))
	if res.StatusCode >= 400 {
		return Result{Reason: ReasonBadStatus, Message: message}
	}
	result := Result{Success: true, Reason: ReasonProbeSucceeded, Message: message}
	if pr.EchoURL != "" {
		result.EgressIP = p.echo(ctx, pr)
	}
	return result
}

// classify names why a probe failed. Order matters: a timeout can surface as
// any of the others.
func classify(ctx context.Context, err error) Result {
	var (
		connectErr *connectStatusError
		netErr     net.Error
		certErr    *tls.CertificateVerificationError
		unknownCA  x509.UnknownAuthorityError
		hostErr    x509.HostnameError
		recordErr  tls.RecordHeaderError
		alertErr   tls.AlertError
	)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return Result{Reason: ReasonTimeout, Message: fmt.Sprintf("no answer within the timeout: %v", err)}
	case errors.Is(err, syscall.ECONNREFUSED):
		return Result{Reason: ReasonConnectRefused, Message: fmt.Sprintf("connecting to the proxy: %v", err)}
	case errors.As(err, &connectErr) && connectErr.status == http.StatusProxyAuthRequired && authenticated(ctx):
		return Result{Reason: ReasonProxyAuthRejected, Message: connectErr.Error() + " to the proxy's credentials"}
	case errors.As(err, &connectErr) && (connectErr.status == http.StatusForbidden || connectErr.status == http.StatusProxyAuthRequired):
		return Result{Reason: ReasonProxyRefusedConnect, Message: connectErr.Error()}
	case errors.As(err, &connectErr):
		return Result{Reason: ReasonTunnelFailed, Message: connectErr.Error()}
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr),
		errors.As(err, &recordErr), errors.As(err, &alertErr):
		return Result{Reason: ReasonTLSError, Message: fmt.Sprintf("TLS with the target through the tunnel: %v", err)}
	default:
		return Result{Reason: ReasonTunnelFailed, Message: fmt.Sprintf("through the proxy: %v", err)}
	}
}

func authenticated(ctx context.Context) bool {
	auth, _ := ctx.Value(proxyAuthKey{}).(*url.Userinfo)
	return auth != nil
}

// tunnelsWithoutCredentials sends the proxy a CONNECT to target's host with
// no Proxy-Authorization and says whether it opened the tunnel. Anything
// but a 200 (a 407, a 403, no answer) is not open; the probe that follows
// says what else is wrong.
func tunnelsWithoutCredentials(ctx context.Context, proxyAddr, target string) (bool, string) {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return false, ""
	}
	hostport := u.Host
	if u.Port() == "" {
		hostport = net.JoinHostPort(u.Hostname(), "443")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", proxyAddr)
	if err != nil {
		return false, ""
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: hostport}, Host: hostport, Header: http.Header{
		"User-Agent": {"egress-proxies-operator-health/1"},
	}}
	if err := req.Write(conn); err != nil {
		return false, ""
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return false, ""
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return false, ""
	}
	return true, fmt.Sprintf("the proxy tunnelled a CONNECT to %s that carried no credentials (%s): anyone who can reach it can use it", hostport, res.Status)
}
