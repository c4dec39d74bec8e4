package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
)

func acquireExclusive(h Harness, c lease.Candidates, ttl time.Duration) (lease.Lease, error) {
	return h.Store.Acquire(context.Background(), lease.AcquireRequest{Candidates: c, TTL: ttl, Exclusive: true})
}

func held(t *testing.T, h Harness, ids ...string) []bool {
	t.Helper()
	out, err := h.Store.Held(context.Background(), ids)
	require.NoError(t, err)
	return out
}

// exclusive: an exclusive lease takes only a proxy nobody holds a lease
// on, and keeps every other lease off it (but those within it) until it
// is released or expires; renewing it keeps the hold.
func exclusive(t *testing.T, h Harness) {
	ctx := context.Background()
	set := indexed("excl", 1, "a", "b")
	shared, err := acquire(h, Of("a"), "", time.Hour)
	require.NoError(t, err)
	assert.False(t, shared.Exclusive)

	x, err := acquireExclusive(h, set, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "b", x.ProxyID, "the only proxy with no lease")
	assert.True(t, x.Exclusive)
	got, err := h.Store.Get(ctx, x.ID)
	require.NoError(t, err)
	assert.True(t, got.Exclusive, "read back")
	assert.Equal(t, []bool{false, true}, held(t, h, "a", "b"))

	_, err = acquireExclusive(h, set, time.Minute)
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none, "a is in use, b is held")
	assert.Equal(t, lease.CauseExclusive, none.Cause)
	for range 4 {
		l, err := acquire(h, set, "shop.example", time.Hour)
		require.NoError(t, err)
		assert.Equal(t, "a", l.ProxyID, "no shared lease goes to the held proxy, however loaded the other")
	}
	_, err = acquire(h, Of("b"), "", time.Minute)
	require.ErrorAs(t, err, &none, "b alone: held")
	assert.Equal(t, lease.CauseExclusive, none.Cause)
	assert.InDelta(t, time.Minute.Seconds(), none.RetryAfter.Seconds(), 1, "until the hold ends")

	// Within the hold: the holder's own leases go to b.
	in, err := h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: set, TTL: time.Minute, Within: x.ID})
	require.NoError(t, err)
	assert.Equal(t, "b", in.ProxyID, "the least loaded, and the holder's")
	require.NoError(t, h.Store.Release(ctx, in.ID))

	// Renewed, the hold outlives its first TTL; expired, it is gone.
	h.Advance(50 * time.Second)
	_, err = h.Store.Renew(ctx, x.ID, time.Minute)
	require.NoError(t, err)
	h.Advance(50 * time.Second)
	_, err = acquire(h, Of("b"), "", time.Minute)
	require.ErrorIs(t, err, lease.ErrNoProxyAvailable, "renewed: still held")
	h.Advance(11 * time.Second)
	assert.Equal(t, []bool{false, false}, held(t, h, "a", "b"), "expired")
	l, err := acquire(h, Of("b"), "", time.Minute)
	require.NoError(t, err, "an expired hold keeps nobody out")
	require.NoError(t, h.Store.Release(ctx, l.ID))

	// Released, at once.
	x, err = acquireExclusive(h, set, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, "b", x.ProxyID)
	require.NoError(t, h.Store.Release(ctx, x.ID))
	assert.Equal(t, []bool{false, false}, held(t, h, "a", "b"))
	l, err = acquire(h, Of("b"), "", time.Minute)
	require.NoError(t, err, "released: free")
	require.NoError(t, h.Store.Release(ctx, l.ID))

	// Paced targets honour holds too.
	x, err = acquireExclusive(h, Of("b"), time.Hour)
	require.NoError(t, err)
	_, err = h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: Of("b"), Target: "shop.example", TTL: time.Minute,
		PaceOf: func(string) lease.Pace { return lease.Pace{Interval: time.Second, Burst: 1} }})
	require.ErrorAs(t, err, &none, "a paced lease skips a held proxy")
	assert.Equal(t, lease.CauseExclusive, none.Cause)
}

// exclusiveConcurrently: many exclusive leases race for few proxies; each
// proxy goes to one of them at most.
func exclusiveConcurrently(t *testing.T, h Harness) {
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%d", i)
	}
	set := indexed("race", 7, ids...)
	var (
		mu   sync.Mutex
		got  = map[string]int{}
		none int
		wg   sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			l, err := acquireExclusive(h, set, time.Hour)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				assert.ErrorIs(t, err, lease.ErrNoProxyAvailable)
				none++
				return
			}
			got[l.ProxyID]++
		})
	}
	wg.Wait()
	assert.Len(t, got, len(ids), "every proxy held")
	for id, n := range got {
		assert.Equal(t, 1, n, "proxy %s held by one lease", id)
	}
	assert.Equal(t, 32-len(ids), none)
}

// sessionStints: a session's stint on its own proxy (Since, IP, Hold)
// starts when it takes a proxy, holds while it stays, and starts again
// on a fresh stint or another proxy.
func sessionStints(t *testing.T, h Harness) {
	ctx := context.Background()
	route := func() lease.Route {
		t.Helper()
		r, err := h.Store.Route(ctx, "s1", "shop.example")
		require.NoError(t, err)
		return r
	}
	set := func(s lease.RouteSet) {
		t.Helper()
		s.Idle = time.Hour
		require.NoError(t, h.Store.SetRoute(ctx, "s1", "shop.example", s))
	}
	set(lease.RouteSet{Proxy: "p1", Own: true, IP: "192.0.2.1", Hold: "h1"})
	first := route()
	assert.False(t, first.Since.IsZero())
	assert.Equal(t, "192.0.2.1", first.IP)
	assert.Equal(t, "h1", first.Hold)

	h.Advance(time.Minute)
	set(lease.RouteSet{Proxy: "p1", Own: true, IP: "192.0.2.9"})
	r := route()
	assert.True(t, r.Since.Equal(first.Since), "the same proxy keeps its stint: %s, then %s", first.Since, r.Since)
	assert.Equal(t, "192.0.2.1", r.IP, "and the IP it started with")
	assert.Equal(t, "h1", r.Hold)
	set(lease.RouteSet{Proxy: "p2", Own: false})
	assert.True(t, route().Since.Equal(first.Since), "a detour is no new stint")

	h.Advance(time.Minute)
	set(lease.RouteSet{Proxy: "p1", Own: true, Fresh: true, IP: "192.0.2.1"})
	r = route()
	assert.InDelta(t, (2 * time.Minute).Seconds(), r.Since.Sub(first.Since).Seconds(), 1, "a fresh stint starts now")
	assert.Empty(t, r.Hold)

	h.Advance(time.Minute)
	set(lease.RouteSet{Proxy: "p3", Own: true, IP: "192.0.2.3", Hold: "h3"})
	r = route()
	assert.InDelta(t, (3 * time.Minute).Seconds(), r.Since.Sub(first.Since).Seconds(), 1, "another proxy: a new stint")
	assert.Equal(t, lease.Route{Own: "p3", Since: r.Since, IP: "192.0.2.3", Hold: "h3", Uses: 1}, r)
}
