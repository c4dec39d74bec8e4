package feed

import (
	"testing"

	"github.com/stretchr/testify/assert"
	toolscache "k8s.io/client-go/tools/cache"
)

type thing struct{ name string }

// TestHandler: adds and updates upsert, deletes remove, a tombstone is
// unwrapped, and other types are ignored.
func TestHandler(t *testing.T) {
	index := map[string]bool{}
	h := Handler(func(x *thing) { index[x.name] = true }, func(x *thing) { delete(index, x.name) })
	h.OnAdd(&thing{"a"}, false)
	h.OnUpdate(nil, &thing{"b"})
	h.OnAdd("not a thing", false)
	assert.Equal(t, map[string]bool{"a": true, "b": true}, index)
	h.OnDelete(&thing{"a"})
	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "b", Obj: &thing{"b"}})
	assert.Empty(t, index, "the tombstone's object is removed too")
}
