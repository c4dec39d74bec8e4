package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/redisstore"
	"github.com/example/egress-proxies-operator/lease/storetest"
	"github.com/example/egress-proxies-operator/test/redisserver"
)

// TestConformance runs the store suite on a real redis-server: each test
// gets a key prefix of its own, and moves the store's clock with the
// store's time offset.
func TestConformance(t *testing.T) {
	srv := redisserver.Start(t, "")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	var n atomic.Int64
	storetest.Run(t, func(*testing.T) storetest.Harness {
		var offset atomic.Int64
		opts := redisstore.Options{
			Client:     client,
			KeyPrefix:  fmt.Sprintf("conformance-%d:", n.Add(1)),
			TimeOffset: func() time.Duration { return time.Duration(offset.Load()) },
		}
		return storetest.Harness{Store: redisstore.New(opts), Replica: redisstore.New(opts), Advance: func(d time.Duration) { offset.Add(int64(d)) }}
	})
}

// TestKeysExpireByThemselves: nothing sweeps Redis; once every lease and
// cooldown has ended, the store's keys are gone, the metrics' indexes
// too, and the counts say so without writing anything.
func TestKeysExpireByThemselves(t *testing.T) {
	client := startClient(t)
	ctx := context.Background()
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "exp:"})
	l, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: storetest.Of("ns/a"), Target: "x.com", TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, store.Report(ctx, l.ID, lease.ResultRateLimited, "x.com", 400*time.Millisecond))
	leases, cooldowns, err := store.Counts(ctx)
	require.NoError(t, err)
	assert.Equal(t, [2]int{1, 1}, [2]int{leases, cooldowns})

	// What outlives them: when the proxy was last leased (an hour), and
	// the outcome memory of the report (lease.OutcomeRetention).
	outlive := map[string]bool{"exp:last:ns/a": true, "exp:out:ns/a": true, "exp:obh:x.com": true, "exp:blocks": true}
	assert.Eventually(t, func() bool {
		keys, err := client.Keys(ctx, "exp:*").Result()
		require.NoError(t, err)
		for _, k := range keys {
			if !outlive[k] {
				return false
			}
		}
		return true
	}, 5*time.Second, 50*time.Millisecond, "lease, load and cooldown keys expire with their TTLs")
	keys, err := client.Keys(ctx, "exp:*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		ttl, err := client.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.True(t, ttl > 0 && ttl <= lease.OutcomeRetention, "%s expires by itself within the outcome memory's retention: %s", k, ttl)
	}
	leases, cooldowns, err = store.Counts(ctx)
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, 0}, [2]int{leases, cooldowns})
}

// TestASampleSpreadsItsTies: beyond SampleSize candidates, a lease goes to
// the least loaded of a random sample, and among equally loaded ones to
// the first the sample drew (no read of when each was last leased). Leases
// released at once all tie at no load, so use spreads over the whole set:
// no proxy leased more than a few times, and the set's two halves (by
// name) used alike, where a tie broken by name would favour the first.
func TestASampleSpreadsItsTies(t *testing.T) {
	client := startClient(t)
	ctx := context.Background()
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "ties:"})
	var ids []string
	for i := range 1000 {
		ids = append(ids, fmt.Sprintf("ns/px-%04d", i))
	}
	set := lease.Candidates{Key: "large", Version: 1, IDs: ids}
	uses := map[string]int{}
	firstHalf := 0
	for range 2000 {
		l, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: set, Target: "x.com", TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, store.Release(ctx, l.ID))
		uses[l.ProxyID]++
		if l.ProxyID < ids[500] {
			firstHalf++
		}
	}
	most := 0
	for _, n := range uses {
		most = max(most, n)
	}
	assert.LessOrEqual(t, most, 12, "no proxy leased far more often than the rest")
	assert.Greater(t, len(uses), 700, "most of the set used")
	assert.InDelta(t, 1000, firstHalf, 150, "both halves of the set used alike")
}

// TestUnavailable: with Redis gone every call fails within its context's
// bound instead of hanging, with Redis paused (a hung server) too, and the
// store works again once Redis is back, with no restart of the client.
func TestUnavailable(t *testing.T) {
	srv := redisserver.Start(t, "s3cret")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "s3cret", MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(redisstore.Options{Client: client})
	bounded := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: storetest.Of("ns/a"), TTL: time.Minute})
		assert.Less(t, time.Since(start), time.Second, "bounded by the context")
		return err
	}
	require.NoError(t, bounded())

	srv.Pause()
	assert.Error(t, bounded(), "a hung Redis")
	srv.Resume()

	srv.Stop()
	err := bounded()
	require.Error(t, err, "Redis is down")
	assert.NotErrorIs(t, err, lease.ErrNoProxyAvailable)
	assert.NotErrorIs(t, err, lease.ErrLeaseNotFound)

	require.NoError(t, srv.Start())
	assert.Eventually(t, func() bool { return bounded() == nil }, 5*time.Second, 50*time.Millisecond, "recovers by itself")
}

// TestScriptsSurviveAFlush: a restarted or new Redis has no scripts; every
// operation loads its own again, the pipelined counts included.
func TestScriptsSurviveAFlush(t *testing.T) {
	client := startClient(t)
	ctx := context.Background()
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "flush:"})
	for range 2 {
		require.NoError(t, client.ScriptFlush(ctx).Err())
		l, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: storetest.Of("ns/a", "ns/b"), TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, client.ScriptFlush(ctx).Err())
		n, err := store.ActiveLeases(ctx, []string{"ns/a", "ns/b"})
		require.NoError(t, err)
		assert.Equal(t, 1, n[0]+n[1])
		require.NoError(t, client.ScriptFlush(ctx).Err())
		require.NoError(t, store.Release(ctx, l.ID))
	}
}

// TestIndexesStayBoundedWithoutScrapes: the metrics' indexes of leases and
// cooldowns hold only what is live after each write, so a store nobody
// scrapes does not grow, and a first scrape after weeks has nothing to
// trim.
func TestIndexesStayBoundedWithoutScrapes(t *testing.T) {
	client := startClient(t)
	ctx := context.Background()
	var offset atomic.Int64
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "bounded:",
		TimeOffset: func() time.Duration { return time.Duration(offset.Load()) }})
	for round := range 3 {
		for i := range 300 {
			l, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: storetest.Of("ns/a", "ns/b"), Target: fmt.Sprintf("site-%d.example", i), TTL: time.Second})
			require.NoError(t, err)
			require.NoError(t, store.Report(ctx, l.ID, lease.ResultRateLimited, l.Target, time.Second))
		}
		leases, err := client.ZCard(ctx, "bounded:leases").Result()
		require.NoError(t, err)
		cooldowns, err := client.ZCard(ctx, "bounded:cooldowns").Result()
		require.NoError(t, err)
		assert.Equal(t, [2]int64{300, 300}, [2]int64{leases, cooldowns}, "round %d: the live ones only, never the ended ones of earlier rounds", round)
		offset.Add(int64(2 * time.Second)) // every lease and cooldown of this round ends
	}
}

// TestTheLedgerIsReadAPageAtATime: a window holding more records than one
// XRANGE page is read whole, in order, a page at a time (no unbounded
// reply), records stamped in one millisecond included.
func TestTheLedgerIsReadAPageAtATime(t *testing.T) {
	client := startClient(t)
	ctx := context.Background()
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "pages:"})
	const n = 2500
	from := time.Now().Add(-time.Second)
	for i := range n {
		require.NoError(t, store.AppendLedger(ctx, lease.LedgerEntry{Kind: lease.LedgerTunnel, Event: lease.LedgerStart,
			LeaseID: fmt.Sprintf("l-%04d", i), Tenant: "platform"}, time.Hour))
	}
	got, err := store.ReadLedger(ctx, from, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Len(t, got, n)
	for i, e := range got {
		require.Equal(t, fmt.Sprintf("l-%04d", i), e.LeaseID, "in order, none twice")
	}
}

// startClient starts a redis-server for the test and a client of it, both
// gone with the test.
func startClient(t *testing.T) *redis.Client {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: redisserver.Start(t, "").Addr})
	t.Cleanup(func() { _ = client.Close() })
	return client
}
