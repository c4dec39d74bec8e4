package pool

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Member is what decide needs to know of one Proxy of a pool.
type Member struct {
	Name string
	// Zone is the member's slot: the zone the pool gave it ("" when the
	// pool has no zones), or, in a pool across providers, its provider
	// and zone (SlotOf).
	Zone string
	// Updated: made from the pool's current template.
	Updated bool
	// Created is the member's creation time: its age counts from it.
	Created time.Time
	// Ready: provisioned and healthy (the Proxy's Ready condition); since
	// ReadySince, the condition's last transition.
	Ready      bool
	ReadySince time.Time
	// Sick: Unhealthy for longer than its replacement period, as the Proxy
	// reconciler judged it (outage guard included); its pool replaces it.
	Sick bool
	// Banned: sites blocked it on enough hosts (the ban judge's Banned
	// condition, as the Proxy reconciler marks it); its pool replaces it.
	Banned bool
	// NoRoom: its provider refused to create it for capacity or quota
	// where the pool placed it; its pool places a successor elsewhere.
	// SpotRefused: that refusal was for capacity, of a Spot member.
	NoRoom, SpotRefused bool
	// Deleting: already on its way out; counted apart from the live ones.
	Deleting bool
	// Jitter in [0, 1), fixed per member: how much of the pool's age jitter
	// shortens its life.
	Jitter float64
}

// Input is a pool's desired shape, its members and the time.
type Input struct {
	Replicas int
	// Zones the members are spread over evenly; or, when Providers is
	// set, each provider's share is spread over its zones.
	Zones     []string
	Providers []ProviderShare
	// Full are the slots with no room now: they keep the members they
	// have, and the members they lack go to the others.
	Full []string
	// MaxSurge and MaxUnavailable are resolved to counts (see budget).
	MaxSurge, MaxUnavailable int
	// MaxAge zero: members are never recycled for age.
	MaxAge        time.Duration
	JitterPercent int
	MinReady      time.Duration
	Members       []Member
	Now           time.Time
}

// ProviderShare is one provider of a pool across providers: its weight
// and its zones.
type ProviderShare struct {
	Name   string
	Weight int
	Zones  []string
}

// SlotOf is the slot of a member of a pool across providers: its provider
// and zone.
func SlotOf(provider, zone string) string { return provider + "/" + zone }

// slots are the places members go, in listing order: the zones, or each
// provider's zones (a provider without zones is one slot); none when the
// pool has neither.
func (in Input) slots() []string {
	if len(in.Providers) == 0 {
		return in.Zones
	}
	var out []string
	for _, p := range in.Providers {
		if len(p.Zones) == 0 {
			out = append(out, SlotOf(p.Name, ""))
		}
		for _, z := range p.Zones {
			out = append(out, SlotOf(p.Name, z))
		}
	}
	return out
}

// Why a member is replaced or removed, counted in
// proxy_operator_pool_replacements_total.
const (
	CauseNoRoom          = "NoRoom"
	CauseUnhealthy       = "UnhealthyTooLong"
	CauseBanned          = "Banned"
	CauseTemplateChanged = "TemplateChanged"
	CauseMaxAge          = "MaxAge"
	CauseZoneRemoved     = "ZoneRemoved"
	CauseZoneRebalance   = "ZoneRebalance"
	CauseScaleDown       = "ScaleDown"
)

// Retirement is a member to delete, and why.
type Retirement struct {
	Name  string
	Cause string
}

// Decision is what one pass does, and the counts the status reports.
type Decision struct {
	// Create is one slot per member to create: its zone ("" for none),
	// or its provider and zone (SlotOf).
	Create []string
	// Delete are the members to delete now.
	Delete []Retirement
	// Recheck, when positive, is how soon the clock alone changes the
	// decision: a member's minReadySeconds or maxAge running out.
	Recheck time.Duration

	Replicas, Ready, Available, Updated, Recycling int
	// Deleting counts the members already being deleted.
	Deleting int
	// MinAvailable is the floor the budget keeps: replicas - maxUnavailable.
	MinAvailable int
	// Settled: the pool has its replicas, all updated, none to replace,
	// all available, nothing to do.
	Settled bool
}

// candidate is a live member with what decide found out about it.
type candidate struct {
	Member
	available bool
	// cause is why it is to be replaced; empty for a member to keep.
	cause string
}

// decide maps a pool's state to what to create and delete now. It is pure,
// so every case is a table row in decide_test.go. The rules are a
// Deployment's rolling update, per member:
//
//   - members outdated, too old, Unhealthy too long or in a zone no longer
//     listed are replaced; zones are kept within one of each other;
//   - up to replicas + maxSurge live members exist at once (the successors
//     are created first);
//   - a member is deleted only while live - (replicas - maxUnavailable) -
//     (kept members not yet available) stays positive, which retires an
//     old member only once its successor is available, and never takes the
//     pool below replicas - maxUnavailable available members.
func decide(in Input) Decision {
	var d Decision
	d.MinAvailable = max(0, in.Replicas-in.MaxUnavailable)
	var live []candidate
	for _, m := range in.Members {
		if m.Deleting {
			d.Deleting++
			continue
		}
		c := candidate{Member: m, available: m.Ready && !in.Now.Before(m.ReadySince.Add(in.MinReady))}
		c.cause = replacementCause(in, m)
		live = append(live, c)
		d.count(c)
		d.Recheck = sooner(d.Recheck, recheckFor(in, c))
	}

	kept, quotas := markSurplus(in, live)
	d.Create = zonesToCreate(in, quotas, kept, len(live))
	d.Delete = retire(in, live, len(live)-d.MinAvailable-unavailable(kept))
	for _, c := range live {
		if c.cause != "" && c.cause != CauseScaleDown {
			d.Recycling++
		}
	}
	d.Settled = len(d.Create) == 0 && len(d.Delete) == 0 && d.Deleting == 0 &&
		d.Replicas == in.Replicas && d.Updated == in.Replicas && d.Available == in.Replicas && d.Recycling == 0
	return d
}

func (d *Decision) count(c candidate) {
	d.Replicas++
	if c.Ready {
		d.Ready++
	}
	if c.available {
		d.Available++
	}
	if c.Updated {
		d.Updated++
	}
}

// replacementCause says why a live member must be replaced, most urgent
// first; empty when it may stay.
func replacementCause(in Input, m Member) string {
	switch {
	case m.NoRoom:
		return CauseNoRoom
	case m.Sick:
		return CauseUnhealthy
	case m.Banned:
		return CauseBanned
	case !m.Updated:
		return CauseTemplateChanged
	case in.MaxAge > 0 && !in.Now.Before(expiry(in, m)):
		return CauseMaxAge
	case len(in.slots()) > 0 && !slices.Contains(in.slots(), m.Zone):
		return CauseZoneRemoved
	}
	return ""
}

// expiry is when a member reaches its maxAge, shortened by its share of
// the jitter.
func expiry(in Input, m Member) time.Time {
	life := float64(in.MaxAge) * (1 - m.Jitter*float64(in.JitterPercent)/100)
	return m.Created.Add(time.Duration(life))
}

// recheckFor is how long until the clock alone changes what decide says of
// c: it becomes available, or too old.
func recheckFor(in Input, c candidate) time.Duration {
	var next time.Duration
	if c.Ready && !c.available {
		next = sooner(next, c.ReadySince.Add(in.MinReady).Sub(in.Now))
	}
	if in.MaxAge > 0 && c.cause == "" {
		next = sooner(next, expiry(in, c.Member).Sub(in.Now))
	}
	return next
}

// sooner is the smaller positive duration of a and b (zero: none).
func sooner(a, b time.Duration) time.Duration {
	switch {
	case b <= 0:
		return a
	case a <= 0 || b < a:
		return b
	}
	return a
}

// zoneQuotas splits replicas over the slots: over the zones at most one
// apart, or first over the providers by weight, then over each one's
// zones. The slots that have most members now take the odd ones, so a
// scale does not move members between them; ties go to the listing order.
// With no slots, one quota of "" holds them all.
func zoneQuotas(in Input, kept map[string]int) map[string]int {
	if len(in.Providers) == 0 {
		if len(in.Zones) == 0 {
			return map[string]int{"": in.Replicas}
		}
		return evenSplit(in.Replicas, in.Zones, kept)
	}
	names := make([]string, len(in.Providers))
	weights := make([]int, len(in.Providers))
	keptBy := map[string]int{}
	slotsOf := map[string][]string{}
	for i, p := range in.Providers {
		names[i], weights[i] = p.Name, p.Weight
		for _, z := range orEmpty(p.Zones) {
			slot := SlotOf(p.Name, z)
			slotsOf[p.Name] = append(slotsOf[p.Name], slot)
			keptBy[p.Name] += kept[slot]
		}
	}
	quotas := map[string]int{}
	for name, n := range weightedSplit(in.Replicas, names, weights, keptBy) {
		for slot, q := range evenSplit(n, slotsOf[name], kept) {
			quotas[slot] = q
		}
	}
	return quotas
}

// withoutFull caps each full slot's quota at the members it keeps and
// gives what it lacks to the open slots: the same provider's first, then
// any, the one with the fewest first. With no open slot, the pool stays
// short until a full one is tried again.
func withoutFull(in Input, quotas, kept map[string]int) map[string]int {
	if len(in.Full) == 0 {
		return quotas
	}
	order := in.slots()
	if len(order) == 0 {
		order = []string{""}
	}
	provider := func(slot string) string { p, _, _ := strings.Cut(slot, "/"); return p }
	for _, full := range order {
		if !slices.Contains(in.Full, full) || quotas[full] <= kept[full] {
			continue
		}
		excess := quotas[full] - kept[full]
		quotas[full] = kept[full]
		for ; excess > 0; excess-- {
			best := ""
			for _, slot := range order {
				if slices.Contains(in.Full, slot) {
					continue
				}
				same := len(in.Providers) > 0 && provider(slot) == provider(full)
				bestSame := best != "" && len(in.Providers) > 0 && provider(best) == provider(full)
				if best == "" || same && !bestSame || same == bestSame && quotas[slot] < quotas[best] {
					best = slot
				}
			}
			if best == "" {
				break
			}
			quotas[best]++
		}
	}
	return quotas
}

// evenSplit splits n over keys at most one apart, the odd ones to the keys
// with most kept members, then in listing order.
func evenSplit(n int, keys []string, kept map[string]int) map[string]int {
	keys = slices.Clone(keys)
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(kept[b], kept[a]) })
	quotas := make(map[string]int, len(keys))
	for i, k := range keys {
		quotas[k] = n / len(keys)
		if i < n%len(keys) {
			quotas[k]++
		}
	}
	return quotas
}

// weightedSplit splits n over keys in proportion to their weights, by the
// largest remainder; ties go to the keys with most kept members, then to
// the listing order.
func weightedSplit(n int, keys []string, weights []int, kept map[string]int) map[string]int {
	total := 0
	for _, w := range weights {
		total += w
	}
	out := make(map[string]int, len(keys))
	if total == 0 {
		return out
	}
	type share struct {
		key       string
		remainder int
		order     int
	}
	shares := make([]share, len(keys))
	given := 0
	for i, k := range keys {
		out[k] = n * weights[i] / total
		given += out[k]
		shares[i] = share{key: k, remainder: n * weights[i] % total, order: i}
	}
	slices.SortStableFunc(shares, func(a, b share) int {
		return cmp.Or(cmp.Compare(b.remainder, a.remainder), cmp.Compare(kept[b.key], kept[a.key]), cmp.Compare(a.order, b.order))
	})
	for i := 0; given < n && i < len(shares); i++ {
		if shares[i].remainder > 0 {
			out[shares[i].key]++
			given++
		}
	}
	return out
}

// orEmpty is zones, or the one empty zone of a provider without zones.
func orEmpty(zones []string) []string {
	if len(zones) == 0 {
		return []string{""}
	}
	return zones
}

// zonesToCreate fills each zone's quota, the emptiest zone first, within
// the surge: at most replicas + maxSurge live members.
func zonesToCreate(in Input, quotas map[string]int, kept map[string][]*candidate, live int) []string {
	deficit := map[string]int{}
	order := in.slots()
	if len(order) == 0 {
		order = []string{""}
	}
	for _, z := range order {
		deficit[z] = quotas[z] - len(kept[z])
	}
	room := in.Replicas + in.MaxSurge - live
	var create []string
	for len(create) < room {
		best := ""
		found := false
		for _, z := range order {
			if deficit[z] > 0 && (!found || deficit[z] > deficit[best]) {
				best, found = z, true
			}
		}
		if !found {
			break
		}
		deficit[best]--
		create = append(create, best)
	}
	return create
}
