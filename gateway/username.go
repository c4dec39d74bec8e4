package gateway

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/tenant"
)

// Identity is what a client's proxy username asks for.
type Identity struct {
	// Session sticks the client's tunnels to one proxy; "" rotates every
	// tunnel.
	Session string
	// Strict keeps the session on one exit IP or fails it; Lifetime ends
	// its stint on one proxy (zero: none); Exclusive holds its proxy alone.
	Strict    bool
	Lifetime  time.Duration
	Exclusive bool
	// MaxUses retires the session's stint on one proxy after that many
	// tunnels (maxuse; zero: no cap).
	MaxUses int64
	// Selector restricts the upstreams, as a lease's selector does.
	Selector broker.Selector
	// Inspect asks the gateway to inspect the client's tunnels (terminate
	// their TLS with the tenant's CA: Options.Inspect); never the default.
	Inspect bool
	// Tenant is who the password names (set by the gateway, not the
	// username): tunnels go only through proxies it may lease.
	Tenant *tenant.Tenant
}

// usesKey caps a session's tunnels on one proxy (Crawlee's
// maxUsageCount): past it, the stint is retired.
const usesKey = "maxuse"

// MaxSessionUses is the largest maxuse a username may give.
const MaxSessionUses = 1_000_000

// Session lifetimes a username may ask for, in minutes (sesstime).
const (
	MinSessionLifetime = time.Minute
	MaxSessionLifetime = 1440 * time.Minute
)

// The provider grammar's keys: what crawler teams already write for the
// commercial providers, each read as ours (docs/crawlers.md has the table).
var (
	// sessionKeys open the session: Bright Data, Decodo and rota write
	// session, Oxylabs sessid, SOAX sessionid; Evomi's hardsession is a
	// strict one.
	sessionKeys = map[string]bool{"session": false, "sessid": false, "sessionid": false, "hardsession": true}
	// lifetimeKeys give the session's lifetime in minutes: sesstime
	// (Oxylabs, rota), sessionduration (Decodo), lifetime (IPRoyal, with
	// or without its "m").
	lifetimeKeys = map[string]bool{"sesstime": true, "sessionduration": true, "lifetime": true}
	// countryKeys select a country, as the attribute country in lower
	// case: country (Bright Data, Decodo, SOAX, Evomi), cc (Oxylabs).
	countryKeys = map[string]bool{"country": true, "cc": true}
)

// Username flags of the provider grammar.
const (
	flagStrict    = "strict"
	flagExclusive = "exclusive"
	flagInspect   = "inspect"
)

// ParseUsername reads a proxy username in either of two forms.
//
// The provider grammar, the one commercial proxy providers use:
//
//	[<anything>-]session-<id>[-sesstime-<minutes>][-maxuse-<n>][-strict][-exclusive][-inspect][-<key>-<value>…]
//
//	session-7                          session "session-7"
//	brd-customer-acme-zone-res-session-7-country-us
//	                                   session "brd-customer-acme-zone-res-session-7", country=us
//	session-7-sesstime-10-strict       a strict session of 10 minutes a proxy
//	customer-acme-cc-US-sessid-7       Oxylabs' keys: session ..., country=us
//
// The session is everything up to its id (so two accounts' session 7 are
// two sessions); before it, anything goes and only a country key selects;
// after it, each key-value pair is a selector term. A username whose part
// before the first '.' has a session key followed by an id is read so.
//
// The dotted form: a session name, then selector terms, each after a dot:
//
//	crawler-7                     session crawler-7, any proxy
//	crawler-7.geo-eu              session crawler-7, attribute geo=eu
//	crawler-7.pool-eu-fleet       session crawler-7, members of ProxyPool eu-fleet
//	crawler-7.geo-eu.tier=premium two terms
//	.geo-eu  (or an empty username) no session: every tunnel rotates
//	crawler-7.inspect             session crawler-7, inspected (Options.Inspect)
//	crawler-7.maxuse-50           session crawler-7, a new proxy every 50 tunnels
//
// A term is key=value, or key-value split at its first '-' (so a key with
// a '-' needs the '=' form, and keys with a '.' cannot be selected here).
// A session name is 1-64 letters, digits, '-' or '_'.
func ParseUsername(username string) (Identity, error) {
	parts := strings.Split(username, ".")
	id := Identity{Session: parts[0], Selector: broker.Selector{}}
	if key, ok := emptySessionID(strings.Split(parts[0], "-")); ok {
		return Identity{}, fmt.Errorf("username %q has the session key %q without an id (%s-<id>): without one, its lifetime and flags would be dropped", parts[0], key, key)
	}
	if at := sessionAt(strings.Split(parts[0], "-")); at >= 0 {
		if err := id.parseProvider(strings.Split(parts[0], "-"), at); err != nil {
			return Identity{}, err
		}
	}
	if id.Session != "" && !broker.ValidSessionName(id.Session) {
		return Identity{}, fmt.Errorf("session %q (the username before the first '.') must be 1-64 letters, digits, '-' or '_'", id.Session)
	}
	for _, term := range parts[1:] {
		if term == flagInspect {
			id.Inspect = true
			continue
		}
		key, value, ok := strings.Cut(term, "=")
		if !ok {
			key, value, ok = strings.Cut(term, "-")
		}
		if !ok || key == "" || value == "" {
			return Identity{}, fmt.Errorf("selector term %q must be key-value or key=value", term)
		}
		if key == usesKey {
			if err := id.maxUses(value); err != nil {
				return Identity{}, err
			}
			continue
		}
		if err := id.term(key, value); err != nil {
			return Identity{}, err
		}
	}
	return id, nil
}

// sessionAt is the index of the first session key followed by an id, -1
// for none.
func sessionAt(tokens []string) int {
	for i := 0; i+1 < len(tokens); i++ {
		if _, ok := sessionKeys[tokens[i]]; ok && tokens[i+1] != "" {
			return i
		}
	}
	return -1
}

// emptySessionID finds a session key followed by an empty id
// ("session--strict", a trailing "session-"): the client meant a session,
// and reading the name as a plain one would drop what follows it.
func emptySessionID(tokens []string) (string, bool) {
	for i := 0; i+1 < len(tokens); i++ {
		if _, ok := sessionKeys[tokens[i]]; ok && tokens[i+1] == "" {
			return tokens[i], true
		}
	}
	return "", false
}

// parseProvider reads the provider grammar from tokens, whose session key
// is at index at.
func (id *Identity) parseProvider(tokens []string, at int) error {
	id.Session = strings.Join(tokens[:at+2], "-")
	id.Strict = sessionKeys[tokens[at]]
	for i := 0; i+1 < at; i++ {
		// Before the session: account, zone, plan names. A country selects.
		if countryKeys[tokens[i]] {
			if err := id.selects(tokens[i], tokens[i+1]); err != nil {
				return err
			}
			i++
		}
	}
	rest := tokens[at+2:]
	for i := 0; i < len(rest); i++ {
		key := rest[i]
		switch key {
		case flagStrict:
			id.Strict = true
			continue
		case flagExclusive:
			id.Exclusive = true
			continue
		case flagInspect:
			id.Inspect = true
			continue
		case "":
			return fmt.Errorf("username %q has an empty term (two '-' in a row)", strings.Join(tokens, "-"))
		}
		if i+1 >= len(rest) || rest[i+1] == "" {
			return fmt.Errorf("username key %q needs a value (%s-<value>)", key, key)
		}
		value := rest[i+1]
		i++
		if lifetimeKeys[key] {
			if id.Lifetime > 0 {
				return fmt.Errorf("the session's lifetime is given twice")
			}
			minutes, err := strconv.Atoi(strings.TrimSuffix(value, "m"))
			lifetime := time.Duration(minutes) * time.Minute
			if err != nil || lifetime < MinSessionLifetime || lifetime > MaxSessionLifetime {
				return fmt.Errorf("%s %q must be whole minutes from %d to %d", key, value, int(MinSessionLifetime.Minutes()), int(MaxSessionLifetime.Minutes()))
			}
			id.Lifetime = lifetime
			continue
		}
		if key == usesKey {
			if err := id.maxUses(value); err != nil {
				return err
			}
			continue
		}
		if _, ok := sessionKeys[key]; ok {
			return fmt.Errorf("username %q names a session twice", strings.Join(tokens, "-"))
		}
		if err := id.selects(key, value); err != nil {
			return err
		}
	}
	return nil
}

// maxUses reads the value of maxuse.
func (id *Identity) maxUses(value string) error {
	if id.MaxUses > 0 {
		return fmt.Errorf("%s is given twice", usesKey)
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < 1 || n > MaxSessionUses {
		return fmt.Errorf("%s %q must be a whole number of tunnels from 1 to %d", usesKey, value, MaxSessionUses)
	}
	id.MaxUses = n
	return nil
}

// selects adds a provider-grammar term: a country key selects the
// attribute country, in lower case.
func (id *Identity) selects(key, value string) error {
	if countryKeys[key] {
		key, value = "country", strings.ToLower(value)
	}
	return id.term(key, value)
}

// term adds a selector term as written.
func (id *Identity) term(key, value string) error {
	if old, dup := id.Selector[key]; dup && old != value {
		return fmt.Errorf("selector key %q is given twice (%q and %q)", key, old, value)
	}
	id.Selector[key] = value
	return nil
}
