package cluster

import (
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/example/egress-proxies-operator/test/simweb"
)

// targetIPs are where the probe target may listen, first free wins, so
// that two local clusters (an e2e run beside a soak) can share a machine.
// The port is always 443: Squid lets CONNECT reach port 443 only.
var targetIPs = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}

// Target is a local HTTPS server standing in for the internet site the
// health engine fetches through every proxy.
type Target struct {
	// URL is the probe URL; CAFile the PEM of the CA that signed its
	// certificate (give it to --health-ca-bundle). EchoURL answers with
	// the address a request came from (--egress-echo-url); BlockedURL
	// answers 403 with a ban page, as a site that blocks every proxy
	// would (a canary that fails).
	URL, CAFile, EchoURL, BlockedURL string
	srv                              *http.Server
	down                             atomic.Bool
}

// SetDown makes the target answer 503 to everything (down) or 204 again:
// an outage of the site every probe fetches, which no proxy can help.
func (t *Target) SetDown(down bool) { t.down.Store(down) }

// StartTarget starts the target on the first free address of targetIPs,
// writing its CA under dir.
func StartTarget(dir string) (*Target, error) {
	var l net.Listener
	var ip string
	var errs []error
	for _, ip = range targetIPs {
		var err error
		if l, err = net.Listen("tcp", net.JoinHostPort(ip, "443")); err == nil {
			break
		}
		errs = append(errs, err)
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("the probe target listens on port 443 (Squid allows CONNECT to 443 only), which needs root or CAP_NET_BIND_SERVICE: %w", err)
		}
	}
	if l == nil {
		return nil, fmt.Errorf("the probe target found no free address among %v on port 443: %w", targetIPs, errors.Join(errs...))
	}
	cert, err := simweb.SelfSigned(net.ParseIP(ip), "egress-proxies-operator local probe target")
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	caFile := filepath.Join(dir, "probe-target-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Leaf.Raw}), 0o644); err != nil {
		_ = l.Close()
		return nil, err
	}
	t := &Target{CAFile: caFile}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/ip":
				host, _, _ := net.SplitHostPort(r.RemoteAddr)
				_, _ = io.WriteString(w, host+"\n")
				return
			case "/blocked":
				w.WriteHeader(http.StatusForbidden)
				_, _ = io.WriteString(w, "<h1>Access denied</h1>")
				return
			}
			if t.down.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}),
		// Probes that fail TLS on purpose would fill the log.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.URL, t.EchoURL, t.BlockedURL, t.srv = "https://"+ip+"/generate_204", "https://"+ip+"/ip", "https://"+ip+"/blocked", srv
	return t, nil
}

// Close stops the target.
func (t *Target) Close() { _ = t.srv.Close() }

// httpGet returns the status of a GET, for readiness waits.
func httpGet(url string) (int, error) {
	client := &http.Client{Timeout: time.Second}
	res, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	_ = res.Body.Close()
	return res.StatusCode, nil
}
