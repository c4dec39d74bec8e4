package storetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
)

// limited acquires a one-minute lease under a Limit.
func limited(h Harness, key string, limit int) (lease.Lease, error) {
	return h.Store.Acquire(context.Background(), lease.AcquireRequest{Candidates: Of("a", "b"), TTL: time.Minute, Limit: lease.Limit{Key: key, Max: limit}})
}

// limits: a Limit caps the live leases under its key, and no other key's;
// the refusal says when the first of them ends; a release, an expiry and
// a renewal move that; Max 0 refuses all.
func limits(t *testing.T, h Harness) {
	ctx := context.Background()
	first, err := limited(h, "lease|team-a", 2)
	require.NoError(t, err)
	h.Advance(10 * time.Second)
	second, err := limited(h, "lease|team-a", 2)
	require.NoError(t, err)
	_, err = limited(h, "lease|team-a", 2)
	var quota *lease.QuotaExceededError
	require.ErrorAs(t, err, &quota, "the third lease is over the limit")
	assert.ErrorIs(t, err, lease.ErrQuotaExceeded)
	assert.InDelta(t, (50 * time.Second).Seconds(), quota.RetryAfter.Seconds(), 1, "when the first lease ends")
	_, err = limited(h, "lease|team-b", 2)
	require.NoError(t, err, "another key is not limited by this one")
	_, err = h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: Of("a"), TTL: time.Minute})
	require.NoError(t, err, "nor is a lease under no limit")

	_, err = h.Store.Renew(ctx, first.ID, 2*time.Minute)
	require.NoError(t, err)
	_, err = limited(h, "lease|team-a", 2)
	require.ErrorAs(t, err, &quota)
	assert.InDelta(t, time.Minute.Seconds(), quota.RetryAfter.Seconds(), 1, "a renewal moves its end: the second lease now ends first")

	require.NoError(t, h.Store.Release(ctx, second.ID))
	third, err := limited(h, "lease|team-a", 2)
	require.NoError(t, err, "a release frees a place")
	_, err = limited(h, "lease|team-a", 2)
	require.ErrorAs(t, err, &quota)

	h.Advance(2*time.Minute + time.Second)
	_, err = h.Store.Get(ctx, third.ID)
	require.ErrorIs(t, err, lease.ErrLeaseNotFound)
	_, err = limited(h, "lease|team-a", 2)
	require.NoError(t, err, "expired leases free their places")
	_, err = limited(h, "lease|team-c", 0)
	require.ErrorAs(t, err, &quota, "Max 0 allows none")
}

// limitsConcurrently: many clients at once never hold more than Max.
func limitsConcurrently(t *testing.T, h Harness) {
	const limit = 5
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			_, err := limited(h, "tunnel|team-a", limit)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, lease.ErrQuotaExceeded):
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(limit), ok.Load(), "exactly Max leases, whatever the races")
	assert.Equal(t, int64(40-limit), refused.Load())
}

// admit: a rate admits a burst, then one per interval, on the store's
// clock; a refusal takes nothing and says when.
func admit(t *testing.T, h Harness) {
	ctx := context.Background()
	for i := range 3 {
		require.NoError(t, h.Store.Admit(ctx, "tunnels|team-a", 100*time.Millisecond, 3), "burst %d", i)
	}
	err := h.Store.Admit(ctx, "tunnels|team-a", 100*time.Millisecond, 3)
	var quota *lease.QuotaExceededError
	require.ErrorAs(t, err, &quota)
	assert.InDelta(t, 0.1, quota.RetryAfter.Seconds(), 0.02)
	require.NoError(t, h.Store.Admit(ctx, "tunnels|team-b", 100*time.Millisecond, 3), "per key")
	h.Advance(100 * time.Millisecond)
	require.NoError(t, h.Store.Admit(ctx, "tunnels|team-a", 100*time.Millisecond, 3), "one interval later, one more")
	require.Error(t, h.Store.Admit(ctx, "tunnels|team-a", 100*time.Millisecond, 3))
}

// usage: counts add up per key; adding nothing reads.
func usage(t *testing.T, h Harness) {
	ctx := context.Background()
	n, err := h.Store.AddUsage(ctx, "bytes|team-a|2026-12-05", 0, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n)
	_, err = h.Store.AddUsage(ctx, "bytes|team-a|2026-12-05", 1500, time.Hour)
	require.NoError(t, err)
	n, err = h.Store.AddUsage(ctx, "bytes|team-a|2026-12-05", 1<<33, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, int64(1500+1<<33), n, "beyond 32 bits")
	n, err = h.Store.AddUsage(ctx, "bytes|team-b|2026-12-05", 0, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, n, "per key")
}

// ledger: records come back in order, stamped on the store's clock, from
// an inclusive range; those older than the retention are forgotten.
func ledger(t *testing.T, h Harness) {
	ctx := context.Background()
	var stamps []time.Time
	for i, event := range []string{lease.LedgerStart, lease.LedgerRenew, lease.LedgerEnd} {
		e := lease.LedgerEntry{Kind: lease.LedgerLease, Event: event, LeaseID: "l1", Tenant: "team-a", Proxy: "ns/a", IP: "203.0.113.7", Target: "x.com",
			Start: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC), Until: time.Date(2026, 12, 5, 12, 5+i, 0, 0, time.UTC)}
		require.NoError(t, h.Store.AppendLedger(ctx, e, time.Hour))
		got, err := h.Store.ReadLedger(ctx, time.Unix(0, 0), time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC))
		require.NoError(t, err)
		require.Len(t, got, i+1)
		stamps = append(stamps, got[i].At)
		h.Advance(time.Minute)
	}
	all, err := h.Store.ReadLedger(ctx, stamps[0], stamps[2])
	require.NoError(t, err)
	require.Len(t, all, 3, "the range is inclusive")
	for i, e := range all {
		assert.Equal(t, []string{lease.LedgerStart, lease.LedgerRenew, lease.LedgerEnd}[i], e.Event, "in order")
		assert.Equal(t, "203.0.113.7", e.IP)
		assert.Equal(t, "team-a", e.Tenant)
		assert.True(t, e.Until.Equal(time.Date(2026, 12, 5, 12, 5+i, 0, 0, time.UTC)), "each record whole")
	}
	assert.InDelta(t, time.Minute.Seconds(), all[1].At.Sub(all[0].At).Seconds(), 1, "stamped on the store's clock")
	middle, err := h.Store.ReadLedger(ctx, stamps[1], stamps[1])
	require.NoError(t, err)
	require.Len(t, middle, 1)
	assert.Equal(t, lease.LedgerRenew, middle[0].Event)

	h.Advance(2 * time.Hour)
	require.NoError(t, h.Store.AppendLedger(ctx, lease.LedgerEntry{LeaseID: "l2", Event: lease.LedgerStart}, time.Hour))
	kept, err := h.Store.ReadLedger(ctx, stamps[0].Add(-time.Hour), stamps[2].Add(4*time.Hour))
	require.NoError(t, err)
	ids := []string{}
	for _, e := range kept {
		ids = append(ids, e.LeaseID)
	}
	assert.NotContains(t, ids, "l1", "records past the retention are forgotten")
	assert.Contains(t, ids, "l2")
}
