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
	mu    sync.Mutex
	pools map[types.NamespacedName]map[string]time.Time
}

// note marks the slots of members refused for want of room as full until
// now + FullSlotBackoff, and returns the slots newly marked.
func (f *fullSlots) note(pool types.NamespacedName, members []Member, now time.Time) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pools == nil {
		f.pools = map[types.NamespacedName]map[string]time.Time{}
	}
	slots := f.pools[pool]
	var fresh []string
	for _, m := range members {
		if !m.NoRoom || m.Deleting {
			continue
		}
		if until, ok := slots[m.Zone]; ok && until.After(now) {
			continue
		}
		if slots == nil {
			slots = map[string]time.Time{}
			f.pools[pool] = slots
		}
		slots[m.Zone] = now.Add(FullSlotBackoff)
		fresh = append(fresh, m.Zone)
	}
	slices.Sort(fresh)
	return slices.Compact(fresh)
}

// current are the pool's slots full at now, sorted, and when the first of
// them opens again (zero: none full); slots whose time is up are dropped.
func (f *fullSlots) current(pool types.NamespacedName, now time.Time) ([]string, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var full []string
	var first time.Time
	for slot, until := range f.pools[pool] {
		if !until.After(now) {
			delete(f.pools[pool], slot)
			continue
		}
		full = append(full, slot)
		if first.IsZero() || until.Before(first) {
			first = until
		}
	}
	slices.Sort(full)
	return full, first
}

func (f *fullSlots) forget(pool types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pools, pool)
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
