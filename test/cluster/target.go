package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// TargetAddr is where the probe target listens: port 443 because Squid lets
// CONNECT reach port 443 only, on a loopback address of its own.
const TargetAddr = "127.0.0.2:443"

// Target is a local HTTPS server standing in for the internet site the
// health engine fetches through every proxy.
type Target struct {
	// URL is the probe URL; CAFile the PEM of the CA that signed its
	// certificate (give it to --health-ca-bundle).
	URL, CAFile string
	srv         *http.Server
}

// StartTarget starts the target, writing its CA under dir.
func StartTarget(dir string) (*Target, error) {
	cert, caPEM, err := selfSigned(net.ParseIP("127.0.0.2"))
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "probe-target-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", TargetAddr)
	if err != nil {
		return nil, fmt.Errorf("the probe target listens on %s (Squid allows CONNECT to 443 only), which needs root or CAP_NET_BIND_SERVICE: %w", TargetAddr, err)
	}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}),
		// Probes that fail TLS on purpose would fill the log.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	return &Target{URL: "https://127.0.0.2/generate_204", CAFile: caFile, srv: srv}, nil
}

// Close stops the target.
func (t *Target) Close() { _ = t.srv.Close() }

// selfSigned makes a certificate for ip, self-signed so it is its own CA.
func selfSigned(ip net.IP) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "egress-proxies-operator local probe target"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{ip},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

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
