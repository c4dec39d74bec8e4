package storetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
)

// paced acquires for host with one declared pace for every candidate.
func paced(h Harness, c lease.Candidates, host string, p lease.Pace, maxWait time.Duration) (lease.Lease, error) {
	return h.Store.Acquire(context.Background(), lease.AcquireRequest{
		Candidates: c, Target: host, TTL: time.Minute, MaxWait: maxWait,
		PaceOf: func(string) lease.Pace { return p },
	})
}

// noneAvailable asserts err is a NoProxyAvailableError with cause, and
// returns its RetryAfter.
func noneAvailable(t *testing.T, err error, cause string) time.Duration {
	t.Helper()
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none)
	assert.Equal(t, cause, none.Cause)
	return none.RetryAfter
}

// within asserts d is want, less what real time may have passed since the
// slot was reserved: a Redis store's clock is the server's TIME (moved by
// the harness's offset), which runs on between two calls, so a wait it
// answers can only have shrunk. Never more than want, to the millisecond.
func within(t *testing.T, want, d time.Duration) {
	t.Helper()
	assert.LessOrEqual(t, d, want+time.Millisecond, "want %s, got %s", want, d)
	assert.GreaterOrEqual(t, d, want-100*time.Millisecond, "want %s, got %s", want, d)
}

// pacing: a declared pace is a bucket per (proxy, host): the burst goes at
// once, then one request per interval, on the proxy whose slot comes
// first; a request that may wait reserves a later slot and is told how
// long; another host, or a request with no target, is not paced.
func pacing(t *testing.T, h Harness) {
	p := lease.Pace{Interval: time.Second, Burst: 2}
	set := Of("a", "b")
	got := map[string]int{}
	for range 4 {
		l, err := paced(h, set, "shop.example", p, 0)
		require.NoError(t, err)
		assert.Zero(t, l.Wait)
		assert.True(t, l.Paced)
		got[l.ProxyID]++
	}
	assert.Equal(t, map[string]int{"a": 2, "b": 2}, got, "each proxy's burst")
	_, err := paced(h, set, "shop.example", p, 0)
	within(t, time.Second, noneAvailable(t, err, lease.CausePaced))

	// Waiting is allowed: the slot in a second is reserved, and the next
	// one is a second later still on the other proxy... then two seconds.
	l, err := paced(h, set, "shop.example", p, 5*time.Second)
	require.NoError(t, err)
	within(t, time.Second, l.Wait)
	l2, err := paced(h, set, "shop.example", p, 5*time.Second)
	require.NoError(t, err)
	within(t, time.Second, l2.Wait)
	assert.NotEqual(t, l.ProxyID, l2.ProxyID)
	l3, err := paced(h, set, "shop.example", p, 5*time.Second)
	require.NoError(t, err)
	within(t, 2*time.Second, l3.Wait)

	// Other hosts and target-less leases are not held back.
	_, err = paced(h, set, "other.example", p, 0)
	require.NoError(t, err)
	free, err := acquire(h, set, "", time.Minute)
	require.NoError(t, err)
	assert.False(t, free.Paced)

	// Time refills the buckets: three seconds on, b (one reservation
	// behind a) may go at once.
	h.Advance(3 * time.Second)
	l, err = paced(h, set, "shop.example", p, 0)
	require.NoError(t, err)
	assert.Zero(t, l.Wait)

	// A proxy cooling down for the host is skipped whatever its pace.
	h2 := Of("c")
	granted, err := paced(h, h2, "cool.example", p, 0)
	require.NoError(t, err)
	require.NoError(t, h.Store.Report(context.Background(), granted.ID, lease.ResultRateLimited, "cool.example", time.Minute))
	_, err = paced(h, h2, "cool.example", p, time.Hour)
	within(t, time.Minute, noneAvailable(t, err, lease.CauseCooling))
}

// pacingConcurrency: at most MaxConcurrent live leases per proxy for the
// host; a release, or the lease's expiry, frees the place.
func pacingConcurrency(t *testing.T, h Harness) {
	p := lease.Pace{MaxConcurrent: 2}
	set := Of("a")
	l1, err := paced(h, set, "shop.example", p, 0)
	require.NoError(t, err)
	_, err = paced(h, set, "shop.example", p, 0)
	require.NoError(t, err)
	_, err = paced(h, set, "shop.example", p, time.Hour)
	noneAvailable(t, err, lease.CauseConcurrency)
	_, err = paced(h, set, "other.example", p, 0)
	require.NoError(t, err, "another host has places of its own")
	require.NoError(t, h.Store.Release(context.Background(), l1.ID))
	_, err = paced(h, set, "shop.example", p, 0)
	require.NoError(t, err)
	h.Advance(time.Minute + time.Second) // every lease expired
	for range 2 {
		_, err = paced(h, set, "shop.example", p, 0)
		require.NoError(t, err)
	}
}

// pacingConcurrencyPerSender: proxies whose pace names one bucket (one
// sender: an IPv4 address, an IPv6 /64) share its MaxConcurrent, as a site
// counts connections per sender; another sender has places of its own. A
// renewed lease keeps its place past its first expiry, and a release frees
// it.
func pacingConcurrencyPerSender(t *testing.T, h Harness) {
	ctx := context.Background()
	paceOf := func(id string) lease.Pace {
		p := lease.Pace{MaxConcurrent: 1}
		if id != "c" {
			p.Bucket = "ip:2001:db8:1:2::/64"
		}
		return p
	}
	take := func(c lease.Candidates) (lease.Lease, error) {
		return h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: c, Target: "shop.example", TTL: time.Minute, PaceOf: paceOf})
	}
	first, err := take(Of("a", "b"))
	require.NoError(t, err)
	_, err = take(Of("a", "b"))
	noneAvailable(t, err, lease.CauseConcurrency)
	other, err := take(Of("a", "b", "c"))
	require.NoError(t, err)
	assert.Equal(t, "c", other.ProxyID, "another sender has a place of its own")

	h.Advance(40 * time.Second)
	_, err = h.Store.Renew(ctx, first.ID, time.Minute)
	require.NoError(t, err)
	h.Advance(40 * time.Second) // past the first expiry, not the renewed one
	_, err = take(Of("a", "b"))
	noneAvailable(t, err, lease.CauseConcurrency)
	require.NoError(t, h.Store.Release(ctx, first.ID))
	_, err = take(Of("a", "b"))
	require.NoError(t, err, "the release freed the sender's place")
}

// pacingFleetCap: one bucket across every proxy under one policy.
func pacingFleetCap(t *testing.T, h Harness) {
	p := lease.Pace{FleetKey: "crawl/shop", FleetInterval: time.Second, FleetBurst: 3}
	set := Of("a", "b", "c", "d")
	for range 3 {
		_, err := paced(h, set, "shop.example", p, 0)
		require.NoError(t, err)
	}
	_, err := paced(h, set, "shop.example", p, 0)
	within(t, time.Second, noneAvailable(t, err, lease.CausePaced))
	other := p
	other.FleetKey = "team-b/shop"
	_, err = paced(h, set, "shop.example", other, 0)
	require.NoError(t, err, "another policy's fleet has a bucket of its own")
}

// learnedPace: a push-back slows the host to the Retry-After (or doubles
// the interval), the same burst of push-backs does not compound, the pace
// halves every half-life and is gone once short, and an adaptive acquire
// applies it to every proxy.
func learnedPace(t *testing.T, h Harness) {
	ctx := context.Background()
	l, err := h.Store.LearnedPace(ctx, "shop.example")
	require.NoError(t, err)
	assert.Zero(t, l.Interval)

	l, err = h.Store.PushBack(ctx, "shop.example", 2*time.Second)
	require.NoError(t, err)
	within(t, 2*time.Second, l.Interval)
	assert.Equal(t, 1, l.PushBacks)
	l, err = h.Store.PushBack(ctx, "shop.example", time.Second)
	require.NoError(t, err)
	within(t, 2*time.Second, l.Interval)

	adaptive := func(c lease.Candidates, maxWait time.Duration) (lease.Lease, error) {
		return h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: c, Target: "shop.example", TTL: time.Minute, Adaptive: true, MaxWait: maxWait})
	}
	set := Of("a", "b")
	for range 2 {
		_, err = adaptive(set, 0)
		require.NoError(t, err)
	}
	_, err = adaptive(set, 0)
	noneAvailable(t, err, lease.CausePaced)
	_, err = acquire(h, set, "shop.example", time.Minute)
	require.NoError(t, err, "a request that does not ask for the learned pace is not held by it")

	// Past the burst window, a push-back doubles the interval.
	h.Advance(3 * time.Second)
	l, err = h.Store.PushBack(ctx, "shop.example", 0)
	require.NoError(t, err)
	// Doubled from its value as decayed over those three seconds.
	assert.InDelta(t, 2*lease.LearnedAt(2*time.Second, time.Time{}, time.Time{}.Add(3*time.Second)).Seconds(), l.Interval.Seconds(), 0.003)

	h.Advance(lease.LearnedHalfLife)
	half, err := h.Store.LearnedPace(ctx, "shop.example")
	require.NoError(t, err)
	assert.InDelta(t, l.Interval.Seconds()/2, half.Interval.Seconds(), 0.003)
	h.Advance(10 * lease.LearnedHalfLife)
	gone, err := h.Store.LearnedPace(ctx, "shop.example")
	require.NoError(t, err)
	assert.Zero(t, gone.Interval)
	_, err = adaptive(set, 0)
	require.NoError(t, err)
}

// pacingConcurrently: many clients at once never take more than the
// burst from a paced host, nor more leases than its concurrency limit.
func pacingConcurrently(t *testing.T, h Harness) {
	p := lease.Pace{Interval: time.Hour, Burst: 3, MaxConcurrent: 2}
	set := Of("a", "b", "c")
	var mu sync.Mutex
	leased := map[string]int{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			l, err := paced(h, set, "shop.example", p, 0)
			if err != nil {
				return
			}
			mu.Lock()
			leased[l.ProxyID]++
			mu.Unlock()
		})
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"a": 2, "b": 2, "c": 2}, leased, "the concurrency limit binds before the burst")
}

// windowBound: paces from lease.WindowPace never let more than their n
// slots fall within one window, per proxy and for the fleet, however the
// requests come: 24 at once from two replicas, each waiting for its slot;
// and they come as fast as the bound allows.
func windowBound(t *testing.T, h Harness) {
	const perIP, fleet, window = 4, 6, time.Second
	perProxy := lease.Pace{Interval: lease.WindowPace(perIP, window), Burst: 1}
	slots := reserveSlots(t, h, "shop.example", perProxy, 24)
	boundedOverWindows(t, slots["a"], perIP, window, "proxy a")
	boundedOverWindows(t, slots["b"], perIP, window, "proxy b")
	assert.LessOrEqual(t, span(slots["a"]), 11*perProxy.Interval+50*time.Millisecond, "as fast as the bound allows")

	fleetWide := lease.Pace{Interval: time.Millisecond, Burst: 1, FleetKey: "crawl/shop", FleetInterval: lease.WindowPace(fleet, window), FleetBurst: 1}
	slots = reserveSlots(t, h, "news.example", fleetWide, 24)
	boundedOverWindows(t, slots[""], fleet, window, "the fleet")
	assert.LessOrEqual(t, span(slots[""]), 23*fleetWide.FleetInterval+50*time.Millisecond, "as fast as the fleet's bound allows")
}

// reserveSlots sends n paced requests for host at once, half through each
// replica, each waiting for its slot; it returns the slots by proxy, and
// all of them under "".
func reserveSlots(t *testing.T, h Harness, host string, p lease.Pace, n int) map[string][]time.Time {
	t.Helper()
	var (
		mu    sync.Mutex
		slots = map[string][]time.Time{}
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			l, err := h.replicas()[i%2].Acquire(context.Background(), lease.AcquireRequest{
				Candidates: Of("a", "b"), Target: host, TTL: time.Minute, MaxWait: time.Minute,
				PaceOf: func(string) lease.Pace { return p },
			})
			if !assert.NoError(t, err) {
				return
			}
			slot := l.CreatedAt.Add(l.Wait)
			mu.Lock()
			defer mu.Unlock()
			slots[l.ProxyID] = append(slots[l.ProxyID], slot)
			slots[""] = append(slots[""], slot)
		})
	}
	wg.Wait()
	require.Len(t, slots[""], n)
	return slots
}

// boundedOverWindows asserts that no bound+1 of slots fall within one
// window, wherever it starts.
func boundedOverWindows(t *testing.T, slots []time.Time, bound int, window time.Duration, what string) {
	t.Helper()
	s := slices.SortedFunc(slices.Values(slots), time.Time.Compare)
	for i := 0; i+bound < len(s); i++ {
		assert.GreaterOrEqual(t, s[i+bound].Sub(s[i]), window, "%s: %d slots from %s fall within one window", what, bound+1, s[i].Format("15:04:05.000"))
	}
}

// span is how long slots take, first to last.
func span(slots []time.Time) time.Duration {
	s := slices.SortedFunc(slices.Values(slots), time.Time.Compare)
	return s[len(s)-1].Sub(s[0])
}

// slots: a request inside a tunnel takes a slot of the same pace a lease
// does, with no lease: after a paced lease the proxy's next slot for the
// host comes one spacing later, a slot too far off is refused and
// reserves nothing, the lease path then waits behind the slots taken, and
// another host is not held back.
func slots(t *testing.T, h Harness) {
	ctx := context.Background()
	p := lease.Pace{Interval: time.Second, Burst: 1}
	_, err := paced(h, Of("a"), "shop.example", p, 0)
	require.NoError(t, err)
	_, err = h.Store.Slot(ctx, "a", "shop.example", p, false, 0)
	within(t, time.Second, noneAvailable(t, err, lease.CausePaced))
	wait, err := h.Store.Slot(ctx, "a", "shop.example", p, false, 5*time.Second)
	require.NoError(t, err)
	within(t, time.Second, wait)
	wait, err = h.Store.Slot(ctx, "a", "shop.example", p, false, 5*time.Second)
	require.NoError(t, err)
	within(t, 2*time.Second, wait)
	l, err := paced(h, Of("a"), "shop.example", p, 5*time.Second)
	require.NoError(t, err)
	within(t, 3*time.Second, l.Wait)
	wait, err = h.Store.Slot(ctx, "a", "other.example", p, false, 0)
	require.NoError(t, err)
	assert.Zero(t, wait)
}

// sharedBucket: proxies whose paces name one Bucket (their exit IPs'
// network, for a site that counts by network) share its slots, for leases
// and tunnels' requests alike; a proxy of another network does not.
func sharedBucket(t *testing.T, h Harness) {
	net := func(bucket string) lease.Pace { return lease.Pace{Interval: time.Second, Burst: 1, Bucket: bucket} }
	paces := map[string]lease.Pace{"a": net("net:10.0.0.0/24"), "b": net("net:10.0.0.0/24"), "c": net("net:10.0.1.0/24")}
	acquireFrom := func(c lease.Candidates, maxWait time.Duration) (lease.Lease, error) {
		return h.Store.Acquire(context.Background(), lease.AcquireRequest{Candidates: c, Target: "shop.example", TTL: time.Minute, MaxWait: maxWait,
			PaceOf: func(id string) lease.Pace { return paces[id] }})
	}
	first, err := acquireFrom(Of("a", "b"), 0)
	require.NoError(t, err)
	assert.Zero(t, first.Wait)
	_, err = acquireFrom(Of("a", "b"), 0)
	within(t, time.Second, noneAvailable(t, err, lease.CausePaced))
	other, err := acquireFrom(Of("a", "b", "c"), 0)
	require.NoError(t, err)
	assert.Equal(t, "c", other.ProxyID, "another network's slot is free")
	wait, err := h.Store.Slot(context.Background(), "b", "shop.example", paces["b"], false, 5*time.Second)
	require.NoError(t, err)
	within(t, time.Second, wait)
}
