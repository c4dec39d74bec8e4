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
	assert.Equal(t, []string{"b"}, f.note(key, refused, t0), "newly full, once")
	assert.Empty(t, f.note(key, refused, t0.Add(time.Minute)), "still full: no second Event")
	full, first := f.current(key, t0.Add(time.Minute))
	assert.Equal(t, []string{"b"}, full)
	assert.Equal(t, t0.Add(FullSlotBackoff), first)
	full, _ = f.current(key, t0.Add(FullSlotBackoff))
	assert.Empty(t, full, "open again after the backoff")
	assert.Equal(t, []string{"b"}, f.note(key, refused, t0.Add(FullSlotBackoff)), "refused again: full again")
	other, _ := f.current(types.NamespacedName{Namespace: "crawl", Name: "us"}, t0)
	assert.Empty(t, other, "per pool")
	f.forget(key)
	full, _ = f.current(key, t0.Add(FullSlotBackoff))
	assert.Empty(t, full)
	assert.Equal(t, "provider aws-eu, zone 1a", slotText(SlotOf("aws-eu", "1a")))
	assert.Equal(t, "provider aws-eu", slotText(SlotOf("aws-eu", "")))
	assert.Equal(t, "zone b", slotText("b"))
}
