package gateway

import (
	"fmt"
	"strings"

	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/tenant"
)

// Identity is what a client's proxy username asks for.
type Identity struct {
	// Session sticks the client's tunnels to one proxy; "" rotates every
	// tunnel.
	Session string
	// Selector restricts the upstreams, as a lease's selector does.
	Selector discovery.Selector
	// Tenant is who the password names (set by the gateway, not the
	// username): tunnels go only through proxies it may lease.
	Tenant *tenant.Tenant
}

// ParseUsername reads a proxy username: a session name, then any number of
// selector terms, each after a dot:
//
//	crawler-7                     session crawler-7, any proxy
//	crawler-7.geo-eu              session crawler-7, attribute geo=eu
//	crawler-7.pool-eu-fleet       session crawler-7, members of ProxyPool eu-fleet
//	crawler-7.geo-eu.tier=premium two terms
//	.geo-eu  (or an empty username) no session: every tunnel rotates
//
// A term is key=value, or key-value split at its first '-' (so a key with
// a '-' needs the '=' form, and keys with a '.' cannot be selected here).
// A session name is 1-64 letters, digits, '-' or '_'.
func ParseUsername(username string) (Identity, error) {
	parts := strings.Split(username, ".")
	id := Identity{Session: parts[0], Selector: discovery.Selector{}}
	if id.Session != "" && !discovery.ValidSessionName(id.Session) {
		return Identity{}, fmt.Errorf("session %q (the username before the first '.') must be 1-64 letters, digits, '-' or '_'", id.Session)
	}
	for _, term := range parts[1:] {
		key, value, ok := strings.Cut(term, "=")
		if !ok {
			key, value, ok = strings.Cut(term, "-")
		}
		if !ok || key == "" || value == "" {
			return Identity{}, fmt.Errorf("selector term %q must be key-value or key=value", term)
		}
		if old, dup := id.Selector[key]; dup && old != value {
			return Identity{}, fmt.Errorf("selector key %q is given twice (%q and %q)", key, old, value)
		}
		id.Selector[key] = value
	}
	return id, nil
}
