package bans

import (
	"cmp"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// Subject is one serving proxy as the judge sees it.
type Subject struct {
	Key types.NamespacedName
	// Group is the fleet it is judged with for the outage guard: its pool
	// (namespace/pool), or its namespace for a stand-alone Proxy.
	Group string
	// Hosts and Window are its ban policy (Proxy.BanPolicy); Hosts 0: it is
	// never banned, though its blocks still count toward the guard.
	Hosts  int
	Window time.Duration
	// Since is when its current instance began serving: blocks before it
	// were its predecessor's.
	Since time.Time
}

// ID is the subject's id in the lease store.
func (s Subject) ID() string { return s.Key.Namespace + "/" + s.Key.Name }

// Verdict is the judge's word on one subject: the hosts that blocked its
// current instance within its window, suspect hosts left out, sorted.
type Verdict struct {
	Hosts  []string
	Banned bool
}

// Suspect is a host that blocked more than the bounded share of one group
// at once: the host, not the proxies, is suspected, and nobody is banned
// for it.
type Suspect struct {
	Group, Host      string
	Blocked, Serving int
}

// SuspectKey keys a group's host in Decide's lastSuspect.
func SuspectKey(group, host string) string { return group + "|" + host }

// MinSuspectBlocked is the fewest proxies of a group one host must block
// to be suspect: one or two blocked proxies of a small fleet say nothing
// about the host.
const MinSuspectBlocked = 3

// ClientBan is a host that blocks one client (its TLS fingerprint) through
// a group's proxies while other clients pass through the same ones: the
// client is banned, not the proxies, and nobody is banned for it.
type ClientBan struct {
	Group, Host, Client string
	// Blocked is how many proxies the host blocked for the client alone,
	// Passed on how many of them another client passed since; Proxies are
	// the blocked ones (their ids in the lease store), sorted.
	Blocked, Passed int
	Proxies         []string
}

// MinClientBanPassed is the fewest of a client's blocked proxies another
// client must pass through for a ClientBan: one pass may be luck.
const MinClientBanPassed = 2

// Decide decides, from the blocks the outcome memory holds, which subjects
// are banned, which hosts are suspect and which ban a client. lastSuspect is when each host
// (keyed SuspectKey) was last found suspect for a group: as a group
// recovers from a host's outage the share falls below the bound before
// every block of it has aged out, so a block from the suspicion (at or
// before its last moment) is pardoned, and only a later one counts. A
// block whose every voice is about one client is that client's; when a
// host blocks a client on MinSuspectBlocked proxies of a group and another
// client passed, on a trusted word (Trusted), through MinClientBanPassed
// of them, the host bans the client (ClientBan), and none of that client's
// blocks counts against a proxy or toward a suspicion. Pure: every case is
// a table row.
func Decide(subjects []Subject, blocks []lease.Block, now time.Time, maxShare float64, lastSuspect map[string]time.Time) (map[types.NamespacedName]Verdict, []Suspect, []ClientBan) {
	byID := make(map[string]*Subject, len(subjects))
	serving := map[string]int{}
	for i := range subjects {
		byID[subjects[i].ID()] = &subjects[i]
		serving[subjects[i].Group]++
	}
	clientBans := findClientBans(byID, blocks, now)
	type groupHost struct{ group, host string }
	blockedBy := map[groupHost]int{}
	hostsOf := map[types.NamespacedName][]string{}
	for _, b := range blocks {
		s, ok := byID[b.Proxy]
		if !ok || b.At.Before(s.Since) || now.Sub(b.At) > s.window() || !Corroborated(b, s.since(now)) {
			continue
		}
		if c := blockedClient(b, s.since(now)); c != "" && slices.ContainsFunc(clientBans, func(cb ClientBan) bool {
			return cb.Group == s.Group && cb.Host == b.Host && cb.Client == c
		}) {
			continue
		}
		blockedBy[groupHost{s.Group, b.Host}]++
		if pardon, ok := lastSuspect[SuspectKey(s.Group, b.Host)]; ok && !b.At.After(pardon) {
			continue
		}
		hostsOf[s.Key] = append(hostsOf[s.Key], b.Host)
	}
	var suspects []Suspect
	for gh, n := range blockedBy {
		if n >= MinSuspectBlocked && float64(n) > maxShare*float64(serving[gh.group]) {
			suspects = append(suspects, Suspect{Group: gh.group, Host: gh.host, Blocked: n, Serving: serving[gh.group]})
		}
	}
	slices.SortFunc(suspects, func(a, b Suspect) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Host, b.Host))
	})
	verdicts := make(map[types.NamespacedName]Verdict, len(subjects))
	for key, hosts := range hostsOf {
		s := byID[key.Namespace+"/"+key.Name]
		var kept []string
		for _, h := range hosts {
			if !slices.Contains(kept, h) && !isSuspect(suspects, s.Group, h) {
				kept = append(kept, h)
			}
		}
		slices.Sort(kept)
		verdicts[key] = Verdict{Hosts: kept, Banned: s.Hosts > 0 && len(kept) >= s.Hosts}
	}
	return verdicts, suspects, clientBans
}

// findClientBans are the hosts that block one client through a group's
// proxies while another client passes through them.
func findClientBans(byID map[string]*Subject, blocks []lease.Block, now time.Time) []ClientBan {
	type key struct{ group, host, client string }
	found := map[key]*ClientBan{}
	for _, b := range blocks {
		s, ok := byID[b.Proxy]
		if !ok || b.At.Before(s.Since) || now.Sub(b.At) > s.window() {
			continue
		}
		since := s.since(now)
		c := blockedClient(b, since)
		if c == "" {
			continue
		}
		k := key{s.Group, b.Host, c}
		cb := found[k]
		if cb == nil {
			cb = &ClientBan{Group: s.Group, Host: b.Host, Client: c}
			found[k] = cb
		}
		cb.Blocked++
		cb.Proxies = append(cb.Proxies, b.Proxy)
		if passedOther(b.Passes, c, since) {
			cb.Passed++
		}
	}
	var out []ClientBan
	for _, cb := range found {
		if cb.Blocked >= MinSuspectBlocked && cb.Passed >= MinClientBanPassed {
			slices.Sort(cb.Proxies)
			out = append(out, *cb)
		}
	}
	slices.SortFunc(out, func(a, b ClientBan) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Client, b.Client))
	})
	return out
}

// blockedClient is the one client whose requests b's voices since then
// were about ("" when any voice's client is unknown, or they differ).
func blockedClient(b lease.Block, since time.Time) string {
	client := ""
	for _, v := range b.Voices {
		if v.At.Before(since) {
			continue
		}
		if v.Client == "" || (client != "" && v.Client != client) {
			return ""
		}
		client = v.Client
	}
	return client
}

// passedOther says whether another client than c passed since then on a
// trusted word: the operator's canary, the platform, or two tenants
// (MinTenantVoices) with other clients, so that one tenant cannot pardon
// the blocks of another's client by claiming successes.
func passedOther(passes []lease.Pass, c string, since time.Time) bool {
	tenants := map[string]bool{}
	for _, p := range passes {
		if p.Client == c || p.At.Before(since) {
			continue
		}
		if Trusted(p.Who) {
			return true
		}
		tenants[p.Who] = true
	}
	return len(tenants) >= MinTenantVoices
}

// Trusted says whether who's word alone is enough: the operator's canary
// (""), the platform's token, or an API without tenants.
func Trusted(who string) bool {
	switch who {
	case "", tenant.PlatformName, tenant.Anonymous.Name:
		return true
	}
	return false
}

// MinTenantVoices is how many tenants must report a host's block of a
// proxy, within its window, for the block to count when no trusted voice
// saw it: one team alone, whose reports and whose own sites' answers are
// its word only, never bans a proxy others share.
const MinTenantVoices = 2

// Corroborated says whether block b may count toward a ban (and toward a
// host's suspicion): a voice since then is the operator's canary, the
// platform's token or an API without tenants, or MinTenantVoices tenants
// agree. A record from before voices were kept counts when a canary saw
// it. Blocks that do not count still steer each lease away from the proxy
// for that host.
func Corroborated(b lease.Block, since time.Time) bool {
	if len(b.Voices) == 0 {
		return b.By == lease.OutcomeCanary
	}
	tenants := 0
	for _, v := range b.Voices {
		if v.At.Before(since) {
			continue
		}
		if Trusted(v.Who) {
			return true
		}
		tenants++
	}
	return tenants >= MinTenantVoices
}

// since is the earliest a block of the subject's counts from at now: the
// start of its window, or of its current instance if later.
func (s *Subject) since(now time.Time) time.Time {
	if from := now.Add(-s.window()); from.After(s.Since) {
		return from
	}
	return s.Since
}

// window is how far back the subject's blocks count: its policy's, or the
// default for one that is never banned (its blocks still count toward the
// guard).
func (s *Subject) window() time.Duration {
	if s.Window > 0 {
		return s.Window
	}
	return lease.OutcomeRetention
}

func isSuspect(suspects []Suspect, group, host string) bool {
	return slices.ContainsFunc(suspects, func(s Suspect) bool { return s.Group == group && s.Host == host })
}
