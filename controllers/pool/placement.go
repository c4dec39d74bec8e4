package pool

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// FullSlotBackoff is how long a zone (or provider) whose create was
// refused for capacity or quota gets no new member: long enough that a
// pool never retries a full zone in a loop, short enough that a zone with
// room again is used within minutes.
const FullSlotBackoff = 5 * time.Minute

// fullSlots remembers, per pool, the slots with no room and until when.
// It lives in the process: after a restart a full slot is tried once
// more, and found full again.
type fullSlots struct {
	mu sync.Mutex
	// full: per pool, the slots with no room; spot: those with no Spot
	// room, where new members are standard instead (StandardForSpot).
	full, spot map[types.NamespacedName]map[string]time.Time
}

// note marks the slots of members refused for want of room until now +
// FullSlotBackoff: as without Spot room when the member asked for Spot,
// was refused for capacity and the pool may fall back to standard; as
// full otherwise. It returns the slots newly marked, each way.
func (f *fullSlots) note(pool types.NamespacedName, members []Member, standardForSpot bool, now time.Time) (full, spot []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range members {
		if !m.NoRoom || m.Deleting {
			continue
		}
		if standardForSpot && m.SpotRefused {
			if mark(&f.spot, pool, m.Zone, now) {
				spot = append(spot, m.Zone)
			}
			continue
		}
		if mark(&f.full, pool, m.Zone, now) {
			full = append(full, m.Zone)
		}
	}
	slices.Sort(full)
	slices.Sort(spot)
	return slices.Compact(full), slices.Compact(spot)
}

// mark sets slot's time in m to now + FullSlotBackoff unless it runs
// already, and says whether it did.
func mark(m *map[types.NamespacedName]map[string]time.Time, pool types.NamespacedName, slot string, now time.Time) bool {
	if *m == nil {
		*m = map[types.NamespacedName]map[string]time.Time{}
	}
	slots := (*m)[pool]
	if until, ok := slots[slot]; ok && until.After(now) {
		return false
	}
	if slots == nil {
		slots = map[string]time.Time{}
		(*m)[pool] = slots
	}
	slots[slot] = now.Add(FullSlotBackoff)
	return true
}

// current are the pool's full slots and those without Spot room at now,
// sorted, and when the first of them opens again (zero: none); slots
// whose time is up are dropped.
func (f *fullSlots) current(pool types.NamespacedName, now time.Time) (full, spot []string, first time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	live := func(m map[types.NamespacedName]map[string]time.Time) []string {
		var out []string
		for slot, until := range m[pool] {
			if !until.After(now) {
				delete(m[pool], slot)
				continue
			}
			out = append(out, slot)
			if first.IsZero() || until.Before(first) {
				first = until
			}
		}
		slices.Sort(out)
		return out
	}
	return live(f.full), live(f.spot), first
}

func (f *fullSlots) forget(pool types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.full, pool)
	delete(f.spot, pool)
}

// slotText names a slot for people: "zone b", "provider aws-eu, zone 1a".
func slotText(slot string) string {
	provider, zone, across := strings.Cut(slot, "/")
	switch {
	case !across && slot == "":
		return "the pool's only place"
	case !across:
		return "zone " + slot
	case zone == "":
		return "provider " + provider
	}
	return fmt.Sprintf("provider %s, zone %s", provider, zone)
}

// fullText lists full slots (sorted) for a condition or Event.
func fullText(slots []string) string {
	texts := make([]string, len(slots))
	for i, s := range slots {
		texts[i] = slotText(s)
	}
	return strings.Join(texts, "; ")
}
