package squidconf

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestVMUserData: a Proxy's own cloud-init goes to its VM as it is; without
// one, the VM gets the hardened one with its source ranges and lease key,
// and a bad range is an error, not an open Squid.
func TestVMUserData(t *testing.T) {
	p := VMParams{Owner: "crawl/eu-1", Port: 3128, AllowedSources: []string{"198.51.100.0/24"}, LeaseKey: SecretManagerKey("projects/p/secrets/egress-proxy-x/versions/latest", "https://secretmanager.googleapis.com")}
	own, err := VMUserData("#cloud-config\npackages: [squid]\n", p)
	require.NoError(t, err)
	assert.Equal(t, "#cloud-config\npackages: [squid]\n", own)

	hardened, err := VMUserData("", p)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(hardened, "#cloud-config\n"))
	assert.Contains(t, hardened, "acl clients src 198.51.100.0/24")
	assert.Contains(t, hardened, "projects/p/secrets/egress-proxy-x/versions/latest", "the VM fetches its key from where the provider stored it")

	p.AllowedSources = []string{"not-a-range"}
	_, err = VMUserData("", p)
	assert.Error(t, err)
}

// TestAVMWithIPv6FindsItsRangeAtBoot: a VM of a provider with ipv6 set
// runs the session-address script before Squid starts, and its squid.conf
// includes what the script writes; a bad count is refused.
func TestAVMWithIPv6FindsItsRangeAtBoot(t *testing.T) {
	p := VMParams{Owner: "crawl/eu-1", Port: 3128, AllowedSources: []string{"198.51.100.0/24"},
		LeaseKey: SecretManagerKey("projects/p/secrets/egress-proxy-x/versions/latest", "https://secretmanager.googleapis.com"),
		IPv6:     &IPv6Egress{}, IPv6PrefixLength: 96}
	doc, err := VMCloudInit(p)
	require.NoError(t, err)
	var cc CloudConfig
	require.NoError(t, yaml.Unmarshal([]byte(doc), &cc))
	assert.Contains(t, cc.WriteFiles[0].Content, "include "+VMSessionAddresses)
	assert.Equal(t, []string{"sh", "-c", "python3 " + VMStagingDir + "/session-addresses.py " + VMSessionAddresses + " gcp 16 96 || : > " + VMSessionAddresses},
		cc.Runcmd[0], "first, with the default count; an empty include on failure")

	p.IPv6 = nil
	doc, err = VMCloudInit(p)
	require.NoError(t, err)
	assert.NotContains(t, doc, "session-addresses")

	p.IPv6 = &IPv6Egress{SessionAddresses: 1000}
	_, err = VMCloudInit(p)
	assert.ErrorContains(t, err, "ipv6.sessionAddresses must be between 1 and 256, got 1000")
}
