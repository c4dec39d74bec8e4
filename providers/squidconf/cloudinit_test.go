package squidconf

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
