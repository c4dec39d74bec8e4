package providertest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// FetchLeaseKey runs the key fetch of a VM's hardened cloud-init as the VM
// would at boot (python3 and squidconf.LeaseKeyFetcher, with the arguments
// the cloud-init gives it), against the metadata server at metadata, and
// returns the key it wrote, or its error and what it said. It fails the
// test when the cloud-init has no fetch, or python3 is missing.
func FetchLeaseKey(t *testing.T, userData, metadata string) ([]byte, error) {
	t.Helper()
	python, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 not found: install Debian's python3 package (sudo apt-get install -y python3; .ci/run does this)")
	var doc squidconf.CloudConfig
	require.NoError(t, yaml.Unmarshal([]byte(userData), &doc))
	script := squidconf.VMStagingDir + "/fetch-lease-key.py"
	i := slices.IndexFunc(doc.WriteFiles, func(f squidconf.WriteFile) bool { return f.Path == script })
	require.GreaterOrEqual(t, i, 0, "the cloud-init stages the fetcher at %s", script)
	j := slices.IndexFunc(doc.Runcmd, func(cmd []string) bool { return len(cmd) > 3 && cmd[0] == "python3" && cmd[1] == script })
	require.GreaterOrEqual(t, j, 0, "the cloud-init runs the fetcher")

	dir := t.TempDir()
	local, out := filepath.Join(dir, "fetch-lease-key.py"), filepath.Join(dir, "lease.key")
	require.NoError(t, os.WriteFile(local, []byte(doc.WriteFiles[i].Content), 0o600))
	args := append([]string{local, out}, doc.Runcmd[j][3:]...)
	cmd := exec.CommandContext(t.Context(), python, args...)
	cmd.Env = append(os.Environ(), "EGRESS_PROXY_METADATA="+metadata, "EGRESS_PROXY_FETCH_SECONDS=0")
	var said bytes.Buffer
	cmd.Stdout, cmd.Stderr = &said, &said
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: %s", err, said.String())
	}
	return os.ReadFile(out)
}
