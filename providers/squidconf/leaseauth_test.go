package squidconf_test

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers/squidconf"
	"github.com/example/egress-proxies-operator/test/squid"
)

// provider are the credentials a provider instance's proxies are built
// from; each proxy's key is derived from them and its id.
var provider = credentials.Credentials{Username: "crawler", Password: "s3cret-password-0123456789", Scheme: credentials.SchemeLease}

// startProxy runs a real Squid as a Managed proxy runs: the rendered
// squid.conf, the lease-auth helper on Debian's perl, proxyID's key. The
// denied destinations include loopback, so an authenticated CONNECT to a
// loopback port is answered 403 and an unauthenticated one 407: the status
// says what the helper decided.
func startProxy(t *testing.T, proxyID, ip string) string {
	t.Helper()
	addr, _ := startProxyIn(t, proxyID, ip)
	return addr
}

// startProxyIn is startProxy, also returning its revocation file.
func startProxyIn(t *testing.T, proxyID, ip string) (addr, revoked string) {
	t.Helper()
	if _, err := os.Stat(squidconf.DefaultPerl); err != nil {
		t.Fatalf("perl not found at %s: it comes with Debian's squid package (sudo apt-get install -y squid; .ci/run does this)", squidconf.DefaultPerl)
	}
	dir := t.TempDir()
	spool := filepath.Join(dir, "spool")
	require.NoError(t, os.MkdirAll(spool, 0o755))
	require.NoError(t, squid.ChownForSquid(spool))
	helper, key := filepath.Join(dir, "lease-auth.pl"), filepath.Join(dir, "lease.key")
	require.NoError(t, os.WriteFile(helper, []byte(squidconf.LeaseAuthHelper), 0o644))
	require.NoError(t, os.WriteFile(key, []byte(provider.LeaseKeyFile(proxyID)), 0o644))
	revoked = filepath.Join(spool, "revoked-leases")
	conf, err := squidconf.Render(squidconf.Params{Owner: proxyID, Port: 3128, AllowedSources: []string{"127.0.0.0/8"},
		DeniedDestinations: []string{"127.0.0.0/8"}, AuthHelper: helper, KeyFile: key, RevokedFile: revoked})
	require.NoError(t, err)
	conf = strings.Replace(conf, "http_port 3128", "http_port "+ip+":3128", 1)
	return squid.Start(t, squid.Config{Address: ip, Port: 3128, ConfigText: conf}).Addr, revoked
}

// connect sends a CONNECT through the proxy at addr with c and returns the
// status.
func connect(t *testing.T, addr string, c credentials.Credentials) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	const target = "127.0.0.1:443"
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.Username+":"+c.Password)))
	require.NoError(t, req.Write(conn))
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

const (
	authenticated = http.StatusForbidden         // past the helper, refused for the destination
	refused       = http.StatusProxyAuthRequired // the helper said no
)

// TestLeaseCredentialsWithRealSquid: a lease's credentials work on their
// proxy only, until they expire or their lease is revoked; a revocation
// never opens a tunnel, and one signed for another proxy revokes nothing.
func TestLeaseCredentialsWithRealSquid(t *testing.T) {
	a := startProxy(t, "crawl/a", "127.0.0.71")
	b := startProxy(t, "crawl/b", "127.0.0.72")
	sign := func(proxyID, lease string, notAfter time.Time) credentials.Credentials {
		c, err := provider.SignedFor(proxyID, lease, notAfter)
		require.NoError(t, err)
		return c
	}
	later := time.Now().Add(time.Hour)
	leaseA := sign("crawl/a", "0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e", later)
	assert.Equal(t, authenticated, connect(t, a, leaseA), "a lease's credentials work on its proxy")
	assert.Equal(t, refused, connect(t, b, leaseA), "and on no other")
	assert.Equal(t, refused, connect(t, a, sign("crawl/a", "expired-lease", time.Now().Add(-time.Second))), "expired credentials")
	tampered := leaseA
	tampered.Username = strings.Replace(leaseA.Username, "~", "~9", 1) // a later expiry, same signature
	assert.Equal(t, refused, connect(t, a, tampered), "a username changed after signing")
	assert.Equal(t, refused, connect(t, a, credentials.Credentials{Username: provider.Username, Password: provider.Password}), "the provider's password itself opens nothing")

	// A revocation signed with b's key is refused by a, and revokes nothing.
	foreign, err := provider.Revocation("crawl/b", []string{"0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e"}, later)
	require.NoError(t, err)
	assert.Equal(t, refused, connect(t, a, foreign))
	other := sign("crawl/a", "7d0e8f00-0000-4000-8000-000000000001", later)
	assert.Equal(t, authenticated, connect(t, a, other))

	revocation, err := provider.Revocation("crawl/a", []string{"0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e", "some-other-lease"}, later)
	require.NoError(t, err)
	assert.Equal(t, refused, connect(t, a, revocation), "a revocation never opens a tunnel")
	require.Eventually(t, func() bool { return connect(t, a, leaseA) == refused }, 15*time.Second, 250*time.Millisecond,
		"a revoked lease's credentials are refused within Squid's 5 seconds of cached answers")
	assert.Equal(t, authenticated, connect(t, a, other), "another lease's still work")
}

// Attack: someone who read a proxy's key mints credentials that never
// expire (and never reach the ledger). The helper refuses any notAfter
// beyond its horizon (the longest lease and a few minutes of skew), for
// credentials and revocations alike; and its revocation file, which every
// release adds to, is trimmed of what expired once it grows.
func TestAReadKeyMintsNothingLongLived(t *testing.T) {
	require.Equal(t, credentials.MaxLifetime+5*time.Minute, squidconf.DefaultCredentialHorizon, "the helper's horizon is the longest lease the operator signs, and skew")
	a, revoked := startProxyIn(t, "crawl/a", "127.0.0.73")
	sign := func(lease string, notAfter time.Time) credentials.Credentials {
		c, err := provider.SignedFor("crawl/a", lease, notAfter)
		require.NoError(t, err)
		return c
	}
	assert.Equal(t, authenticated, connect(t, a, sign("longest-lease", time.Now().Add(credentials.MaxLifetime))), "the longest lease the operator signs")
	assert.Equal(t, refused, connect(t, a, sign("minted-for-a-day", time.Now().Add(24*time.Hour))), "a day ahead: refused")
	assert.Equal(t, refused, connect(t, a, sign("minted-forever", time.Unix(99999999999, 0))), "forever: refused")

	far, err := provider.Revocation("crawl/a", []string{"longest-lease"}, time.Now().Add(24*time.Hour))
	require.NoError(t, err)
	assert.Equal(t, refused, connect(t, a, far))
	_, statErr := os.Stat(revoked)
	assert.True(t, os.IsNotExist(statErr), "a revocation beyond the horizon writes nothing")

	// A revocation file grown past 64 KiB of expired entries is trimmed
	// on the next revocation, which is kept.
	var old strings.Builder
	past := time.Now().Add(-time.Hour).Unix()
	for i := range 4000 {
		fmt.Fprintf(&old, "expired-lease-%05d %d\n", i, past)
	}
	require.NoError(t, os.WriteFile(revoked, []byte(old.String()), 0o666))
	require.NoError(t, squid.ChownForSquid(revoked))
	rev, err := provider.Revocation("crawl/a", []string{"longest-lease"}, time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, refused, connect(t, a, rev))
	data, err := os.ReadFile(revoked)
	require.NoError(t, err)
	assert.Equal(t, "longest-lease "+strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)+"\n", string(data), "only the live revocation is left")
	require.Eventually(t, func() bool { return connect(t, a, sign("longest-lease", time.Now().Add(time.Hour))) == refused },
		15*time.Second, 250*time.Millisecond, "and it holds")
}
