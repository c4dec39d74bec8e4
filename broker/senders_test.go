package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// TestARefusalReachesTheWholeSender: a site that blocks one proxy of an
// IPv6 /64 blocked the /64: a report on one lease cools its /64 siblings
// for the host too, with the same reporter, while a proxy of another /64
// keeps a clean record; an ok report stays the proxy's own.
func TestARefusalReachesTheWholeSender(t *testing.T) {
	ctx := context.Background()
	f := &brokerFixture{view: NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))}
	store := lease.NewMemoryStore(f.clock)
	f.broker = New(Options{DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, DefaultCooldown: DefaultCooldown, Store: store, View: f.view, Clock: f.clock})
	f.proxy("v6a", "2001:db8:1:2::10")
	f.proxy("v6b", "2001:db8:1:2:ffff::20")
	f.proxy("v6c", "2001:db8:1:3::10")

	leases := map[string]string{}
	for range 3 {
		l, err := f.broker.Lease(ctx, tenant.Platform, LeaseRequest{TTL: time.Minute})
		require.NoError(t, err)
		leases[l.ProxyID] = l.ID
	}
	require.Len(t, leases, 3, "one lease per proxy")

	require.NoError(t, f.broker.Report(ctx, tenant.Platform, leases["crawl/v6a"], lease.ResultOK, "shop.example", 0, 0))
	require.NoError(t, f.broker.Report(ctx, tenant.Platform, leases["crawl/v6a"], lease.ResultBlocked, "shop.example", time.Minute, 0))

	sibling, err := store.Outcomes(ctx, "crawl/v6b")
	require.NoError(t, err)
	require.Len(t, sibling, 1, "the sibling has a record with the host")
	assert.Equal(t, "shop.example", sibling[0].Host)
	assert.Positive(t, sibling[0].Blocked)
	assert.Zero(t, sibling[0].Served, "the ok was the reporting proxy's own")
	require.Len(t, sibling[0].Voices, 1)
	assert.Equal(t, tenant.PlatformName, sibling[0].Voices[0].Who, "the same reporter: one voice")

	other, err := store.Outcomes(ctx, "crawl/v6c")
	require.NoError(t, err)
	assert.Empty(t, other, "another /64 is another sender")

	for _, id := range leases {
		require.NoError(t, f.broker.Release(ctx, tenant.Platform, id))
	}
	got, err := f.broker.Lease(ctx, tenant.Platform, LeaseRequest{TTL: time.Minute, Target: "shop.example", Exclusive: true})
	require.NoError(t, err)
	assert.Equal(t, "crawl/v6c", got.ProxyID, "the other /64 still serves the host")
	_, err = f.broker.Lease(ctx, tenant.Platform, LeaseRequest{TTL: time.Minute, Target: "shop.example", Exclusive: true})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "both proxies of the blocked /64 cool for the host")
}
