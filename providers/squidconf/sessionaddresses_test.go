package squidconf_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers/squidconf"
	"github.com/example/egress-proxies-operator/test/squid"
)

// fakeMetadata answers what session-addresses.py asks a cloud's metadata
// server: GCE's ipv6s (with Metadata-Flavor), IMDSv2's token, MAC and
// delegated prefix (with the token).
func fakeMetadata(t *testing.T, gceIPv6s, ec2Prefix string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /computeMetadata/v1/instance/network-interfaces/0/ipv6s", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" || gceIPv6s == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(gceIPv6s))
	})
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("imds-token"))
	})
	mux.HandleFunc("GET /latest/meta-data/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-aws-ec2-metadata-token") != "imds-token" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/mac":
			_, _ = w.Write([]byte("0e:11:22:33:44:55"))
		case "/latest/meta-data/network/interfaces/macs/0e:11:22:33:44:55/ipv6-prefix":
			_, _ = w.Write([]byte(ec2Prefix))
		default:
			http.NotFound(w, r)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// runScript runs the VM's session-address script as cloud-init does, with
// its metadata server at metadata and no routes (a test is no VM).
func runScript(t *testing.T, metadata string, args ...string) (string, error) {
	t.Helper()
	python, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 is needed: sudo apt-get install -y python3 (.ci/run installs it)")
	dir := t.TempDir()
	script, out := filepath.Join(dir, "session-addresses.py"), filepath.Join(dir, "session-addresses.conf")
	require.NoError(t, os.WriteFile(script, []byte(squidconf.SessionAddressScript), 0o600))
	cmd := exec.Command(python, append([]string{script, out}, args...)...)
	cmd.Env = append(os.Environ(), "EGRESS_PROXY_METADATA="+metadata, "EGRESS_PROXY_ROUTES=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", &exec.ExitError{ProcessState: cmd.ProcessState, Stderr: msg}
	}
	written, err := os.ReadFile(out)
	require.NoError(t, err)
	return string(written), nil
}

// TestAVMWritesTheSessionAddressesTheGatewayCounts: the script a VM runs at
// boot finds its IPv6 range on either cloud's metadata server and writes
// the same lines as the operator's SessionAddressRules (so address i is
// the one netid.SessionAddress names); a VM whose metadata has no range
// writes nothing and fails, which cloud-init turns into an empty file.
func TestAVMWritesTheSessionAddressesTheGatewayCounts(t *testing.T) {
	metadata := fakeMetadata(t, "2001:db8:1:2:0:5::", "2001:db8:7:8:9::/80")

	gce, err := runScript(t, metadata, "gcp", "4", "96")
	require.NoError(t, err)
	assert.Equal(t, squidconf.RangeRules(netip.MustParsePrefix("2001:db8:1:2:0:5::/96"), 4), gce)
	assert.Contains(t, gce, "tcp_outgoing_address 2001:db8:1:2:0:5:0:1 session_address_0")

	ec2, err := runScript(t, metadata, "aws", "3")
	require.NoError(t, err)
	assert.Equal(t, squidconf.RangeRules(netip.MustParsePrefix("2001:db8:7:8:9::/80"), 3), ec2)
	assert.Equal(t, 7, strings.Count(ec2, "\n"), "an ACL and an address each, and the range's own address for the rest")
	assert.True(t, strings.HasSuffix(ec2, "\ntcp_outgoing_address 2001:db8:7:8:9::\n"), "the rest leave from the range's own address")

	_, err = runScript(t, fakeMetadata(t, "", ""), "gcp", "4", "96")
	assert.Error(t, err, "no IPv6 range: the script fails, cloud-init leaves the include empty")
}

// TestSquidReadsTheSessionAddresses: the squid.conf the operator renders,
// with session addresses inline and a VM's include, is one Squid accepts.
func TestSquidReadsTheSessionAddresses(t *testing.T) {
	bin, err := squid.Binary()
	require.NoError(t, err)
	dir := t.TempDir()
	include := filepath.Join(dir, "session-addresses.conf")
	prefix := netip.MustParsePrefix("2001:db8:1:2:0:5::/96")
	require.NoError(t, os.WriteFile(include, []byte(squidconf.RangeRules(prefix, 2)), 0o644))
	conf, err := squidconf.Render(squidconf.Params{Owner: "crawl/dual", Port: 3128, AllowedSources: []string{"198.51.100.0/24"},
		AuthHelper: "/usr/local/lib/egress-proxy/lease-auth.pl", KeyFile: "/etc/squid/lease.key", RevokedFile: "/var/spool/squid/revoked",
		SessionAddressBase: prefix.Addr(), SessionAddresses: squidconf.SessionAddressesOf(prefix, 2), SessionAddressesInclude: include})
	require.NoError(t, err)
	assert.Contains(t, conf, "request_header_access "+netid.SessionHeader+" deny all")
	path := filepath.Join(dir, "squid.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
	out, err := exec.Command(bin, "-k", "parse", "-f", path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "Processing: tcp_outgoing_address 2001:db8:1:2:0:5:0:2 session_address_1")
	assert.NotContains(t, string(out), "FATAL")
}
