package credentials

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

func TestGenerateValidates(t *testing.T) {
	a, b := Generate(), Generate()
	require.NoError(t, a.Validate())
	assert.NotEqual(t, a.Password, b.Password)
	assert.NotEqual(t, a.Fingerprint(), b.Fingerprint(), "a new password changes the spec hash")
}

func TestValidateNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		c    Credentials
		want string
	}{
		{Credentials{Username: "", Password: strings.Repeat("x", 20)}, "username must be"},
		{Credentials{Username: "a:b", Password: strings.Repeat("x", 20)}, "username must be"},
		{Credentials{Username: "crawler", Password: "short"}, "password must be 16-72 characters, has 5"},
		{Credentials{Username: "crawler", Password: strings.Repeat("x", 73)}, "password must be 16-72"},
		{Credentials{Username: "crawler", Password: "has a space in it ok"}, "printable ASCII"},
	} {
		assert.ErrorContains(t, tc.c.Validate(), tc.want)
	}
}

func TestNeverPrintsThePassword(t *testing.T) {
	c := Credentials{Username: "crawler", Password: "do-not-print-me-please"}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c)} {
		assert.NotContains(t, s, c.Password)
	}
}

// TestPasswordFileWorksWithSquidsHelper runs Debian's basic_ncsa_auth on the
// file: the right password is OK, a wrong one ERR.
func TestPasswordFileWorksWithSquidsHelper(t *testing.T) {
	const helper = "/usr/lib/squid/basic_ncsa_auth"
	if _, err := os.Stat(helper); err != nil {
		t.Fatalf("%s not found: install Debian's squid package (sudo apt-get install -y squid; .ci/run does this)", helper)
	}
	c := Generate()
	line, err := c.PasswordFile()
	require.NoError(t, err)
	assert.NotContains(t, line, c.Password)
	path := filepath.Join(t.TempDir(), "passwd")
	require.NoError(t, os.WriteFile(path, []byte(line), 0o600))
	cmd := exec.Command(helper, path)
	cmd.Stdin = strings.NewReader(c.Username + " " + c.Password + "\n" + c.Username + " wrong-password-000000\n")
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 2, "%s", out)
	assert.Equal(t, "OK", strings.TrimSpace(lines[0]))
	assert.True(t, strings.HasPrefix(lines[1], "ERR"), "a wrong password: %q", lines[1])
}

// TestPasswordFileIsHashedOncePerCredentials: instances sharing credentials
// share one bcrypt line (bcrypt's cost per instance capped bring-up); other
// credentials get their own, and each line checks its own password only.
func TestPasswordFileIsHashedOncePerCredentials(t *testing.T) {
	a := Generate()
	first, err := a.PasswordFile()
	require.NoError(t, err)
	again, err := a.PasswordFile()
	require.NoError(t, err)
	assert.Equal(t, first, again, "the same credentials: the same line, not a fresh hash")
	b := Generate()
	other, err := b.PasswordFile()
	require.NoError(t, err)
	assert.NotEqual(t, first, other)
	for _, tc := range []struct {
		line     string
		password string
		want     bool
	}{{first, a.Password, true}, {first, b.Password, false}, {other, b.Password, true}} {
		_, hash, _ := strings.Cut(strings.TrimSpace(tc.line), ":")
		assert.Equal(t, tc.want, bcrypt.CompareHashAndPassword([]byte(hash), []byte(tc.password)) == nil)
	}
}

// TestPasswordFileIsHashedOnceUnderConcurrentCallers: a fleet's first
// moments ask for the same credentials' line from every worker at once; one
// hashes, the others wait for its line (before, each hashed: as many bcrypt
// costs as workers, and as many different lines).
func TestPasswordFileIsHashedOnceUnderConcurrentCallers(t *testing.T) {
	c := Generate()
	lines := make([]string, 8)
	var wg sync.WaitGroup
	for i := range lines {
		wg.Go(func() {
			line, err := c.PasswordFile()
			assert.NoError(t, err)
			lines[i] = line
		})
	}
	wg.Wait()
	for _, line := range lines {
		assert.Equal(t, lines[0], line, "one hash, shared by every caller")
	}
}
