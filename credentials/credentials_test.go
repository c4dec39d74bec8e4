package credentials

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
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

// TestLeaseCredentials: each proxy has its own key, never the password;
// signed credentials name their subject and expiry; a record without the
// lease scheme hands out the shared password as it is; the scheme survives
// a Secret round trip.
func TestLeaseCredentials(t *testing.T) {
	c := Credentials{Username: "crawler", Password: "s3cret-password-0123456789", Scheme: SchemeLease}
	assert.NotEqual(t, c.LeaseKeyFile("crawl/a"), c.LeaseKeyFile("crawl/b"), "a key per proxy")
	assert.NotContains(t, c.LeaseKeyFile("crawl/a"), c.Password)
	other := c
	other.Password = "another-password-0123456789"
	assert.NotEqual(t, c.LeaseKeyFile("crawl/a"), other.LeaseKeyFile("crawl/a"), "a new password, new keys")

	at := time.Unix(1796521451, 0)
	signed, err := c.SignedFor("crawl/a", "0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e", at)
	require.NoError(t, err)
	assert.Equal(t, "0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e~1796521451", signed.Username)
	assert.Len(t, signed.Password, 43, "unpadded base64url of a SHA-256 HMAC")
	again, err := c.SignedFor("crawl/a", "0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e", at)
	require.NoError(t, err)
	assert.Equal(t, signed, again, "deterministic: any replica signs the same")
	elsewhere, err := c.SignedFor("crawl/b", "0f6c1c9e-1b7a-4c1e-9d51-3f1a2b3c4d5e", at)
	require.NoError(t, err)
	assert.NotEqual(t, signed.Password, elsewhere.Password)
	_, err = c.SignedFor("crawl/a", "not~a subject", at)
	assert.ErrorContains(t, err, "subject")
	_, err = c.Revocation("crawl/a", make([]string, 1), at)
	assert.ErrorContains(t, err, "lease id")

	legacy := Credentials{Username: "crawler", Password: "s3cret-password-0123456789"}
	shared, err := legacy.SignedFor("crawl/a", "lease", at)
	require.NoError(t, err)
	assert.Equal(t, legacy, shared, "an instance built before the lease scheme takes the shared password")

	back, err := FromSecret(&corev1.Secret{Data: c.Data()})
	require.NoError(t, err)
	assert.Equal(t, c, back)
	assert.NotContains(t, legacy.Data(), KeyScheme)
}
