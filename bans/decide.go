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

// Decide decides, from the blocks the outcome memory holds, which subjects
// are banned and which hosts are suspect. lastSuspect is when each host
// (keyed SuspectKey) was last found suspect for a group: as a group
// recovers from a host's outage the share falls below the bound before
// every block of it has aged out, so a block from the suspicion (at or
// before its last moment) is pardoned, and only a later one counts. Pure:
// every case is a table row.
func Decide(subjects []Subject, blocks []lease.Block, now time.Time, maxShare float64, lastSuspect map[string]time.Time) (map[types.NamespacedName]Verdict, []Suspect) {
	byID := make(map[string]*Subject, len(subjects))
	serving := map[string]int{}
	for i := range subjects {
		byID[subjects[i].ID()] = &subjects[i]
		serving[subjects[i].Group]++
	}
	type groupHost struct{ group, host string }
	blockedBy := map[groupHost]int{}
	hostsOf := map[types.NamespacedName][]string{}
	for _, b := range blocks {
		s, ok := byID[b.Proxy]
		if !ok || b.At.Before(s.Since) || now.Sub(b.At) > s.window() || !Corroborated(b, s.since(now)) {
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
	return verdicts, suspects
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
		switch v.Who {
		case "", tenant.PlatformName, tenant.Anonymous.Name:
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
