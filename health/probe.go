package health

import (
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
)

// Result is the outcome of one probe.
type Result struct {
	// Success is true when the target answered with a non-error status.
	Success bool
	// Reason is ReasonProbeSucceeded or the failure's reason.
	Reason string
	// Message says what happened, for the condition.
	Message string
}

// Prober fetches a URL through a proxy.
type Prober interface {
	// Probe fetches target through the proxy at proxyAddr (host:port) within
	// timeout.
	Probe(ctx context.Context, proxyAddr, target string, timeout time.Duration) Result
}

// HTTPProber is the real probe: an HTTPS GET through the proxy, so a CONNECT
// tunnel, TLS to the target through it and a non-error status from the
// target. A proxy that accepts TCP but cannot egress fails it.
type HTTPProber struct {
	transport *http.Transport
}

type proxyAddrKey struct{}

// connectStatusError carries the proxy's answer to CONNECT.
type connectStatusError struct{ status int }

func (e *connectStatusError) Error() string {
	return fmt.Sprintf("proxy answered CONNECT with %d %s", e.status, http.StatusText(e.status))
}

// NewHTTPProber builds a prober trusting roots (nil: the system roots). One
// transport serves every proxy: the proxy is chosen per request, and
// keep-alives are off so every probe opens a fresh tunnel.
func NewHTTPProber(roots *x509.CertPool) *HTTPProber {
	t := &http.Transport{
		Proxy: func(req *http.Request) (*url.URL, error) {
			addr, _ := req.Context().Value(proxyAddrKey{}).(string)
			if addr == "" {
				return nil, errors.New("probe without a proxy address")
			}
			return &url.URL{Scheme: "http", Host: addr}, nil
		},
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode != http.StatusOK {
				return &connectStatusError{status: res.StatusCode}
			}
			return nil
		},
		DialContext:         (&net.Dialer{}).DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DisableKeepAlives:   true,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: -1,
	}
	return &HTTPProber{transport: t}
}

// Probe performs one probe.
func (p *HTTPProber) Probe(ctx context.Context, proxyAddr, target string, timeout time.Duration) Result {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, proxyAddrKey{}, proxyAddr), timeout)
	defer cancel()
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
	if res.StatusCode >= 400 {
		return Result{Reason: ReasonBadStatus, Message: fmt.Sprintf("%s answered %s through the proxy", target, res.Status)}
	}
	return Result{Success: true, Reason: ReasonProbeSucceeded, Message: fmt.Sprintf("%s answered %s through the proxy", target, res.Status)}
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
