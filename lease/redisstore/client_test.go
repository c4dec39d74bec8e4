package redisstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/redisstore"
	"github.com/example/egress-proxies-operator/lease/storetest"
	"github.com/example/egress-proxies-operator/test/redisserver"
)

// selfSigned writes a certificate for 127.0.0.1 and redis.test, and its
// key, into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redis.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"redis.test"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

// TestConnection drives the connection the operator builds from its flags
// (redisstore.NewClient) against real redis-servers: TLS checked against
// --redis-tls-ca-file and the server name, and a password read from its
// file on every new connection, so a rotated Secret takes effect.
func TestConnection(t *testing.T) {
	ctx := context.Background()
	works := func(c redisstore.Connection) error {
		client, err := redisstore.NewClient(c)
		require.NoError(t, err)
		defer client.Close()
		store := redisstore.New(redisstore.Options{Client: client})
		if err := store.Ping(ctx); err != nil {
			return err
		}
		_, err = store.Acquire(ctx, lease.AcquireRequest{Candidates: storetest.Of("ns/a"), TTL: time.Minute})
		return err
	}

	t.Run("TLS", func(t *testing.T) {
		certFile, keyFile := selfSigned(t, t.TempDir())
		srv := redisserver.StartTLS(t, certFile, keyFile)
		base := redisstore.Connection{Address: srv.Addr, TLS: true, CAFile: certFile, Timeout: 2 * time.Second}
		assert.NoError(t, works(base), "trusted CA, the address's own name")
		named := base
		named.ServerName = "redis.test"
		assert.NoError(t, works(named), "trusted CA, the name set by --redis-tls-server-name")
		wrongName := base
		wrongName.ServerName = "other.test"
		assert.ErrorContains(t, works(wrongName), "certificate", "a certificate for another name is refused")
		noCA := base
		noCA.CAFile = ""
		assert.ErrorContains(t, works(noCA), "certificate", "a CA outside the system roots is refused")
		plain := base
		plain.TLS, plain.CAFile = false, ""
		assert.Error(t, works(plain), "a TLS server does not answer plain text")
	})

	t.Run("password rotation", func(t *testing.T) {
		srv := redisserver.Start(t, "first")
		file := filepath.Join(t.TempDir(), "password")
		require.NoError(t, os.WriteFile(file, []byte("first\n"), 0o600))
		c := redisstore.Connection{Address: srv.Addr, PasswordFile: file, Timeout: 2 * time.Second}
		require.NoError(t, works(c))

		// The Secret and the server change together; a new connection
		// reads the new password.
		client, err := redisstore.NewClient(c)
		require.NoError(t, err)
		defer client.Close()
		require.NoError(t, client.ConfigSet(ctx, "requirepass", "second").Err())
		require.NoError(t, os.WriteFile(file, []byte("second\n"), 0o600))
		require.NoError(t, works(c))

		require.NoError(t, os.WriteFile(file, []byte("wrong\n"), 0o600))
		assert.ErrorContains(t, works(c), "WRONGPASS")
	})

	t.Run("bad settings name the flag", func(t *testing.T) {
		for _, tc := range []struct {
			c    redisstore.Connection
			want string
		}{
			{redisstore.Connection{Address: "redis", Timeout: time.Second}, "--redis-address"},
			{redisstore.Connection{Address: "redis:6379"}, "--lease-store-timeout"},
			{redisstore.Connection{Address: "redis:6379", Timeout: time.Second, DB: -1}, "--redis-db"},
			{redisstore.Connection{Address: "redis:6379", Timeout: time.Second, CAFile: "/etc/ca.pem"}, "--redis-tls"},
			{redisstore.Connection{Address: "redis:6379", Timeout: time.Second, PasswordFile: "/nonexistent"}, "--redis-password-file"},
			{redisstore.Connection{Address: "redis:6379", SentinelAddresses: []string{"s1:26379"}, SentinelMaster: "leases", Timeout: time.Second}, "exclude each other"},
			{redisstore.Connection{SentinelAddresses: []string{"s1:26379"}, Timeout: time.Second}, "--redis-sentinel-master"},
			{redisstore.Connection{SentinelAddresses: []string{"s1"}, SentinelMaster: "leases", Timeout: time.Second}, "--redis-sentinel-addresses"},
			{redisstore.Connection{Address: "redis:6379", SentinelMaster: "leases", Timeout: time.Second}, "need --redis-sentinel-addresses"},
		} {
			_, err := redisstore.NewClient(tc.c)
			assert.ErrorContains(t, err, tc.want)
		}
		empty := filepath.Join(t.TempDir(), "empty")
		require.NoError(t, os.WriteFile(empty, nil, 0o600))
		_, err := redisstore.NewClient(redisstore.Connection{Address: "redis:6379", Timeout: time.Second, PasswordFile: empty})
		assert.ErrorContains(t, err, "empty")
	})
}
