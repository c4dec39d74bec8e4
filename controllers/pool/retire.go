package pool

import (
	"cmp"
	"slices"
)

// Which members a pool retires: surplus first, then the least needed,
// within the replacement budget.

// markSurplus gives a cause to the members beyond their zone's quota (the
// unavailable and the oldest first) and returns the members kept, by zone,
// with the quotas.
func markSurplus(in Input, live []candidate) (map[string][]*candidate, map[string]int) {
	counts := map[string]int{}
	for _, c := range live {
		if c.cause == "" {
			counts[c.Zone]++
		}
	}
	quotas := withoutFull(in, zoneQuotas(in, counts), counts)
	byZone := map[string][]*candidate{}
	for i := range live {
		if c := &live[i]; c.cause == "" {
			byZone[c.Zone] = append(byZone[c.Zone], c)
		}
	}
	// Surplus is a scale-down unless another zone lacks members: then it
	// is moved there.
	cause := CauseScaleDown
	for zone, quota := range quotas {
		if counts[zone] < quota {
			cause = CauseZoneRebalance
		}
	}
	for zone, members := range byZone {
		slices.SortFunc(members, retireFirst)
		surplus := len(members) - quotas[zone]
		for _, c := range members[:max(0, surplus)] {
			c.cause = cause
		}
		byZone[zone] = members[max(0, surplus):]
	}
	return byZone, quotas
}

func unavailable(kept map[string][]*candidate) int {
	n := 0
	for _, members := range kept {
		for _, c := range members {
			if !c.available {
				n++
			}
		}
	}
	return n
}

// retire picks the members to delete within budget: the unavailable first
// (deleting them costs no availability), then the most urgent and oldest,
// never below minAvailable available members.
func retire(in Input, live []candidate, budget int) []Retirement {
	var out []candidate
	for _, c := range live {
		if c.cause != "" {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b candidate) int { return retireFirst(&a, &b) })
	available := 0
	for _, c := range live {
		if c.available {
			available++
		}
	}
	var retired []Retirement
	for _, c := range out {
		if budget <= 0 {
			break
		}
		if c.available {
			if available-1 < max(0, in.Replicas-in.MaxUnavailable) {
				continue
			}
			available--
		}
		budget--
		retired = append(retired, Retirement{Name: c.Name, Cause: c.cause})
	}
	return retired
}

// retireFirst orders members for removal: unavailable before available,
// sick before the rest, then oldest first, then by name.
func retireFirst(a, b *candidate) int {
	return cmp.Or(
		boolOrder(!a.available, !b.available),
		boolOrder(a.Sick, b.Sick),
		boolOrder(a.Banned, b.Banned),
		a.Created.Compare(b.Created),
		cmp.Compare(a.Name, b.Name),
	)
}

// boolOrder sorts true before false.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}
