// Package credentials is the one place proxy credentials are made, checked,
// turned into each proxy's lease key, signed per lease and looked up: the reconciler builds every Managed
// instance with them, the health engine probes with them and discovery hands
// them to authenticated crawlers. It reads Secrets and writes none, and it
// must never import the controllers, a provider, the health engine or
// discovery (depguard enforces it): they all import it.
package credentials

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"

	corev1 "k8s.io/api/core/v1"
)

// Credentials are a provider instance's (or a Proxy's own Secret's)
// username and password, from which each of its proxies' lease keys
// derive; or, signed for one lease (SignedFor), the HTTP Basic credentials
// a client presents to one proxy. The zero value means none.
type Credentials struct {
	Username string
	Password string
	// Scheme says how the instances built with them check clients:
	// SchemeLease (per-lease credentials signed with a key derived from
	// the password), or "" (the password itself: instances built before
	// SchemeLease).
	Scheme string
}

// Keys of a credentials Secret: those of the kubernetes.io/basic-auth type.
const (
	KeyUsername = corev1.BasicAuthUsernameKey
	KeyPassword = corev1.BasicAuthPasswordKey
)

// Bounds on what a credentials Secret may hold. The upper one is what
// bcrypt took when proxies checked the password itself: Secrets made then
// stay valid.
const (
	MinPasswordLength = 16
	MaxPasswordLength = 72
	// GeneratedUsername is the username of generated credentials.
	GeneratedUsername = "crawler"
)

var usernamePattern = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,63}$`)

// IsZero reports whether there are no credentials.
func (c Credentials) IsZero() bool { return c.Username == "" && c.Password == "" }

// String never shows the password, so a credentials value that reaches a log
// line or an error by mistake leaks nothing.
func (c Credentials) String() string {
	if c.IsZero() {
		return "<none>"
	}
	return c.Username + ":<redacted>"
}

// GoString is String, for %#v.
func (c Credentials) GoString() string { return c.String() }

// Validate checks credentials a user supplied: a username Squid's password
// file can hold, and a password long enough that guessing it is hopeless.
func (c Credentials) Validate() error {
	var errs []error
	if !usernamePattern.MatchString(c.Username) {
		errs = append(errs, fmt.Errorf("%s must be 1-64 letters, digits, '-', '_' or '.', starting with a letter or digit", KeyUsername))
	}
	if n := len(c.Password); n < MinPasswordLength || n > MaxPasswordLength {
		errs = append(errs, fmt.Errorf("%s must be %d-%d characters, has %d", KeyPassword, MinPasswordLength, MaxPasswordLength, n))
	}
	for _, r := range c.Password {
		if r <= ' ' || r > '~' {
			errs = append(errs, fmt.Errorf("%s must be printable ASCII without spaces", KeyPassword))
			break
		}
	}
	return errors.Join(errs...)
}

// Generate makes fresh credentials: crypto/rand's Text, 26 letters and
// digits carrying 130 random bits.
func Generate() Credentials {
	return Credentials{Username: GeneratedUsername, Password: rand.Text()}
}

// FromSecret reads and checks credentials from a Secret's username and
// password keys.
func FromSecret(secret *corev1.Secret) (Credentials, error) {
	c := Credentials{Username: string(secret.Data[KeyUsername]), Password: string(secret.Data[KeyPassword]), Scheme: string(secret.Data[KeyScheme])}
	if err := c.Validate(); err != nil {
		return Credentials{}, fmt.Errorf("credentials Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	return c, nil
}

// Data is the credentials as a Secret's data.
func (c Credentials) Data() map[string][]byte {
	data := map[string][]byte{KeyUsername: []byte(c.Username), KeyPassword: []byte(c.Password)}
	if c.Scheme != "" {
		data[KeyScheme] = []byte(c.Scheme)
	}
	return data
}

// Fingerprint is a hash of the credentials for the spec hash, so that a
// new password replaces the instances built with the old one. It is a salted
// SHA-256 of a random password: it gives nothing away.
func (c Credentials) Fingerprint() string {
	sum := sha256.Sum256([]byte("egress-proxies-operator/credentials\x00" + c.Username + "\x00" + c.Password))
	return hex.EncodeToString(sum[:])
}

// Userinfo is the credentials for a proxy URL, nil when there are none.
func (c Credentials) Userinfo() *url.Userinfo {
	if c.IsZero() {
		return nil
	}
	return url.UserPassword(c.Username, c.Password)
}
