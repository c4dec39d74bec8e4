package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"
)

// TestFullSlotsBackOff: a slot whose member was refused for room is full
// for FullSlotBackoff, marked once however many members say so, and open
// again after.
func TestFullSlotsBackOff(t *testing.T) {
	var f fullSlots
	key := types.NamespacedName{Namespace: "crawl", Name: "eu"}
	refused := []Member{{Name: "x", Zone: "b", NoRoom: true}, {Name: "y", Zone: "b", NoRoom: true}, {Name: "z", Zone: "c"}}
	full, _ := f.note(key, refused, false, t0)
	assert.Equal(t, []string{"b"}, full, "newly full, once")
	full, _ = f.note(key, refused, false, t0.Add(time.Minute))
	assert.Empty(t, full, "still full: no second Event")
	full, spot, first := f.current(key, t0.Add(time.Minute))
	assert.Equal(t, []string{"b"}, full)
	assert.Empty(t, spot)
	assert.Equal(t, t0.Add(FullSlotBackoff), first)
	full, _, _ = f.current(key, t0.Add(FullSlotBackoff))
	assert.Empty(t, full, "open again after the backoff")
	full, _ = f.note(key, refused, false, t0.Add(FullSlotBackoff))
	assert.Equal(t, []string{"b"}, full, "refused again: full again")
	other, _, _ := f.current(types.NamespacedName{Namespace: "crawl", Name: "us"}, t0)
	assert.Empty(t, other, "per pool")
	f.forget(key)
	full, _, _ = f.current(key, t0.Add(FullSlotBackoff))
	assert.Empty(t, full)

	// A Spot member refused for capacity, in a pool that may fall back:
	// its slot has no Spot room, and stays open for standard members.
	spotRefused := []Member{{Name: "s", Zone: "c", NoRoom: true, SpotRefused: true}, {Name: "q", Zone: "d", NoRoom: true}}
	full, spot = f.note(key, spotRefused, true, t0)
	assert.Equal(t, []string{"d"}, full, "a quota refusal: full")
	assert.Equal(t, []string{"c"}, spot)
	full, spot, _ = f.current(key, t0)
	assert.Equal(t, []string{"d"}, full)
	assert.Equal(t, []string{"c"}, spot)
	full, _ = f.note(types.NamespacedName{Namespace: "crawl", Name: "strict"}, spotRefused, false, t0)
	assert.Equal(t, []string{"c", "d"}, full, "without the fallback, a Spot refusal fills its slot too")
	assert.Equal(t, "provider aws-eu, zone 1a", slotText(SlotOf("aws-eu", "1a")))
	assert.Equal(t, "provider aws-eu", slotText(SlotOf("aws-eu", "")))
	assert.Equal(t, "zone b", slotText("b"))
}
