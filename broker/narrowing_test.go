package broker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// grants is a Tenants whose every answer is allowed, counting the asks.
type grants struct {
	allowed atomic.Bool
	asked   atomic.Int32
}

func (g *grants) Identify(context.Context, string) (*tenant.Tenant, error) { return nil, nil }
func (g *grants) MayLease(context.Context, *tenant.Tenant, tenant.Proxy) (bool, error) {
	g.asked.Add(1)
	return g.allowed.Load(), nil
}
func (g *grants) MayReadAttribution(context.Context, *tenant.Tenant) (bool, error) { return false, nil }
func (g *grants) MayReadUsage(context.Context, *tenant.Tenant) (bool, error)       { return false, nil }

// TestATenantsNarrowingIsReusedWithinItsTTL: a tenant's second lease asks
// RBAC nothing (its narrowed set is remembered, with a key of its own for
// the store's index); a new proxy in the view narrows anew at once; a
// revoked grant stops leases once the TTL has passed, not before.
func TestATenantsNarrowingIsReusedWithinItsTTL(t *testing.T) {
	ctx := context.Background()
	team := tenant.ForUser(&authenticationv1.UserInfo{Username: "system:serviceaccount:team-a:crawler"})
	g := &grants{}
	g.allowed.Store(true)
	f := &brokerFixture{view: NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))}
	f.broker = New(Options{DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, DefaultCooldown: DefaultCooldown,
		Store: lease.NewMemoryStore(f.clock), View: f.view, Clock: f.clock, Tenants: g, TenantReviewTTL: 30 * time.Second})
	f.proxy("eu-1", "127.0.0.9")
	f.proxy("eu-2", "127.0.0.10")

	first, err := f.broker.candidates(ctx, team, nil)
	require.NoError(t, err)
	assert.Len(t, first.IDs, 2)
	assert.NotEmpty(t, first.Key, "a narrowed set the store may index")
	asked := g.asked.Load()
	assert.Equal(t, int32(2), asked, "one ask per stand-alone Proxy")

	_, err = f.broker.Lease(ctx, team, LeaseRequest{TTL: time.Minute})
	require.NoError(t, err)
	again, err := f.broker.candidates(ctx, team, nil)
	require.NoError(t, err)
	assert.Equal(t, first, again, "reused: the same set, key and version")
	assert.Equal(t, asked, g.asked.Load(), "RBAC was not asked again within the TTL")

	f.proxy("eu-3", "127.0.0.11")
	grown, err := f.broker.candidates(ctx, team, nil)
	require.NoError(t, err)
	assert.Len(t, grown.IDs, 3, "a new proxy is narrowed in at once")
	assert.NotEqual(t, first.Version, grown.Version, "the store rebuilds its index")

	g.allowed.Store(false)
	still, err := f.broker.candidates(ctx, team, nil)
	require.NoError(t, err)
	assert.Len(t, still.IDs, 3, "a revoked grant holds until the TTL passes")
	f.clock.Step(31 * time.Second)
	_, err = f.broker.Lease(ctx, team, LeaseRequest{TTL: time.Minute})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "past the TTL the revocation holds")
	assert.Zero(t, refused.Candidates)
}
