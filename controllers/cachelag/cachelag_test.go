package cachelag

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

var (
	proxyA = Key{Kind: "Proxy", NamespacedName: types.NamespacedName{Namespace: "crawl", Name: "a"}}
	proxyB = Key{Kind: "Proxy", NamespacedName: types.NamespacedName{Namespace: "crawl", Name: "b"}}
)

// TestBehind: the cache is behind a write while it shows exactly the
// version the write replaced (or, for a create, nothing); once it shows
// anything else the write is forgotten, and its lag observed.
func TestBehind(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tr := New("test-behind", clk, time.Second)
	observed := func() int { return testutil.CollectAndCount(lagSeconds, "proxy_operator_cache_lag_seconds") }
	before := observed()

	tr.Wrote(proxyA, "10", "payload")
	payload, behind := tr.Behind(proxyA, "10")
	assert.True(t, behind)
	assert.Equal(t, "payload", payload)
	_, behind = tr.Behind(proxyB, "10")
	assert.False(t, behind, "another object has no write to wait for")

	_, behind = tr.Behind(proxyA, "11")
	assert.False(t, behind, "the cache shows the write")
	_, behind = tr.Behind(proxyA, "10")
	assert.False(t, behind, "forgotten once seen: an older copy later is not waited for again")
	assert.GreaterOrEqual(t, observed(), max(before, 1), "the lag is observed")

	tr.Wrote(proxyB, "", nil)
	_, behind = tr.Behind(proxyB, "")
	assert.True(t, behind, "created: behind while the cache does not have it")
	clk.SetTime(clk.Now().Add(time.Second))
	_, behind = tr.Behind(proxyB, "")
	assert.False(t, behind, "past the bound the controller acts on what it sees")
}

// TestPending lists the writes with a payload, until the bound.
func TestPending(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	tr := New("test-pending", clk, time.Second)
	tr.Wrote(proxyA, "", "pool-1")
	tr.Wrote(proxyB, "3", "pool-2")
	assert.Equal(t, []Key{proxyA}, tr.Pending(func(p any) bool { return p == "pool-1" }))
	tr.Forget(proxyA)
	assert.Empty(t, tr.Pending(func(p any) bool { return p == "pool-1" }))
	clk.SetTime(clk.Now().Add(time.Second))
	assert.Empty(t, tr.Pending(func(p any) bool { return p == "pool-2" }), "past the bound: no longer pending")
}

// TestPrune: a write nobody asks about again is dropped after the bound,
// and the map with it, so a fleet's bring-up leaves nothing behind.
func TestPrune(t *testing.T) {
	tr := New("test-prune", nil, 20*time.Millisecond)
	for i := range 100 {
		tr.Wrote(Key{Kind: "Proxy", NamespacedName: types.NamespacedName{Namespace: "crawl", Name: string(rune('a' + i%26))}}, "1", nil)
	}
	require.Eventually(t, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.writes == nil && !tr.pruning
	}, 2*time.Second, 5*time.Millisecond)
}
