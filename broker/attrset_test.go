package broker

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAttributeSetsAreShared: equal attributes are one set, whatever the
// order they were built in; different ones are not; a set no entry holds
// leaves the table.
func TestAttributeSetsAreShared(t *testing.T) {
	var sets attributeSets
	a := sets.intern(map[string]string{"geo": "eu", "mode": "Managed", "pool": "crawl"})
	b := sets.intern(map[string]string{"pool": "crawl", "geo": "eu", "mode": "Managed"})
	c := sets.intern(map[string]string{"geo": "us", "mode": "Managed", "pool": "crawl"})
	assert.Same(t, a, b, "equal attributes share one set")
	assert.NotSame(t, a, c)
	assert.Equal(t, "us", c.m["geo"])
	// A value that spells out more pairs is not confused with them.
	d := sets.intern(map[string]string{"k": "1:v1:x0:"})
	e := sets.intern(map[string]string{"k": "v", "x": ""})
	assert.NotSame(t, d, e)
	assert.Equal(t, map[string]string{"k": "v", "x": ""}, e.m)

	runtime.KeepAlive(a)
	a, b, c, d, e = nil, nil, nil, nil, nil
	require.Eventually(t, func() bool {
		runtime.GC()
		sets.mu.Lock()
		defer sets.mu.Unlock()
		return len(sets.sets) == 0
	}, 5*time.Second, 10*time.Millisecond, "sets nobody holds are dropped from the table")
	_, _, _, _, _ = a, b, c, d, e
}
