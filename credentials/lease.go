package credentials

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// SchemeLease marks credentials whose instances check per-lease
// credentials (Scheme): each lease gets a username and password of its
// own, signed with a key only its proxy holds (LeaseKey), that expire with
// the lease and stop working once it is released (Revocation). Records of
// instances built before it have no scheme: the shared password of their
// provider instance, which they alone still take.
const SchemeLease = "lease-hmac-v1"

// KeyScheme is the credentials record's key naming its scheme.
const KeyScheme = "scheme"

// LeaseKey is the key a proxy checks its leases' credentials with: an
// HMAC of the proxy's id (namespace/name) under the password of the
// credentials it was built from. Each proxy has its own, so credentials
// signed for one are refused by every other; the password itself never
// reaches an instance.
func (c Credentials) LeaseKey(proxyID string) []byte {
	mac := hmac.New(sha256.New, []byte(c.Password))
	mac.Write([]byte("egress-proxies-operator/lease-key\x00" + proxyID))
	return mac.Sum(nil)
}

// LeaseKeyFile is LeaseKey as the proxy's key file holds it: hex, one line.
func (c Credentials) LeaseKeyFile(proxyID string) string {
	return hex.EncodeToString(c.LeaseKey(proxyID)) + "\n"
}

// subjectPattern is what a signed username may name: a lease id (a UUID),
// or the operator's own "gateway-..." and "probe-..." subjects.
var subjectPattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// SignedFor is the credentials the proxy proxyID takes for subject until
// notAfter (a Unix second): username "<subject>~<notAfter>", password the
// key's HMAC of the username. Credentials of no scheme (a legacy record)
// are returned as they are: their instances take the shared password.
func (c Credentials) SignedFor(proxyID, subject string, notAfter time.Time) (Credentials, error) {
	if c.Scheme != SchemeLease {
		return c, nil
	}
	if !subjectPattern.MatchString(subject) {
		return Credentials{}, fmt.Errorf("signing credentials: subject %q must be 1-64 letters, digits or '-'", subject)
	}
	user := subject + "~" + strconv.FormatInt(notAfter.Unix(), 10)
	return Credentials{Username: user, Password: sign(c.LeaseKey(proxyID), user), Scheme: SchemeLease}, nil
}

// Revocation is the credentials that tell proxyID's helper to refuse the
// credentials of the leases ids from now until notAfter (when they expire
// anyway): username "revoke~<notAfter>~<id>.<id>...". The proxy answers
// them 407, and remembers the ids in its revocation file.
func (c Credentials) Revocation(proxyID string, ids []string, notAfter time.Time) (Credentials, error) {
	for _, id := range ids {
		if !subjectPattern.MatchString(id) {
			return Credentials{}, fmt.Errorf("revoking credentials: lease id %q must be 1-64 letters, digits or '-'", id)
		}
	}
	user := "revoke~" + strconv.FormatInt(notAfter.Unix(), 10) + "~" + strings.Join(ids, ".")
	return Credentials{Username: user, Password: sign(c.LeaseKey(proxyID), user), Scheme: SchemeLease}, nil
}

// MaxLifetime is the furthest ahead the operator signs a lease's
// credentials (the longest --lease-max-ttl allowed): a proxy's helper
// refuses a notAfter beyond it and a few minutes of clock skew
// (squidconf.DefaultCredentialHorizon), so a key read off a proxy mints
// nothing that outlives it.
const MaxLifetime = 6 * time.Hour

// MaxRevocationIDs bounds the lease ids one Revocation names, so its
// username stays well inside what Squid reads (and Basic auth carries).
const MaxRevocationIDs = 8

// sign is the password of a signed username: the unpadded base64url of
// HMAC-SHA256(key, username), as the helper computes it.
func sign(key []byte, user string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
