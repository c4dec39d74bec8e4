// Package storetest is the conformance suite of lease.Store: every
// backend (memory, Redis) runs the same tests unchanged, which is what keeps
// two backends honest. It is test support: only _test files import it.
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
)

// Harness is one fresh, empty store under test.
type Harness struct {
	Store lease.Store
	// Replica is a second replica's store on the same state (a second
	// client of the same Redis); nil: Store itself (the memory store).
	Replica lease.Store
	// Advance moves the store's clock forward by d.
	Advance func(d time.Duration)
}

// replicas are the harness's two replicas' stores.
func (h Harness) replicas() [2]lease.Store {
	if h.Replica == nil {
		return [2]lease.Store{h.Store, h.Store}
	}
	return [2]lease.Store{h.Store, h.Replica}
}

// Run runs the whole suite; newHarness gives each test an empty store of
// its own.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		test func(t *testing.T, h Harness)
	}{
		{"AgainstAModel", againstAModel},
		{"Concurrently", concurrently},
		{"Expiry", expiry},
		{"RenewAndReport", renewAndReport},
		{"NoProxyAvailable", noProxyAvailable},
		{"ActiveLeases", activeLeases},
		{"Refusals", refusals},
		{"ProbeAsks", probeAsks},
		{"LargeCandidateSets", largeCandidateSets},
		{"Sessions", sessions},
		{"Pacing", pacing},
		{"PacingConcurrency", pacingConcurrency},
		{"PacingConcurrencyPerSender", pacingConcurrencyPerSender},
		{"PacingFleetCap", pacingFleetCap},
		{"WindowBound", windowBound},
		{"Slots", slots},
		{"SharedBucket", sharedBucket},
		{"LearnedPace", learnedPace},
		{"PacingConcurrently", pacingConcurrently},
		{"Limits", limits},
		{"LimitsConcurrently", limitsConcurrently},
		{"Admit", admit},
		{"Usage", usage},
		{"Ledger", ledger},
		{"OutcomeMemory", outcomeMemory},
		{"OutcomeCooldown", outcomeCooldown},
		{"ForgetProxy", forgetProxy},
		{"Clients", clients},
		{"ClientBans", clientBans},
		{"EndCooldown", endCooldown},
		{"ReportsRecordOutcomes", reportsRecordOutcomes},
		{"Voices", voices},
		{"BetterRecord", betterRecord},
		{"BurnedIPs", burnedIPs},
		{"Exclusive", exclusive},
		{"ExclusiveConcurrently", exclusiveConcurrently},
		{"SessionStints", sessionStints},
		{"SessionScores", sessionScores},
		{"UsageRows", usageRows},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newHarness(t)) })
	}
}

// Of makes a candidate set for ids, with no index kept (Key "").
func Of(ids ...string) lease.Candidates { return lease.Candidates{IDs: ids} }

// indexed is a candidate set as the view hands it out: a key and version.
func indexed(key string, version uint64, ids ...string) lease.Candidates {
	return lease.Candidates{Key: key, Version: version, IDs: ids}
}

func acquire(h Harness, c lease.Candidates, target string, ttl time.Duration) (lease.Lease, error) {
	return h.Store.Acquire(context.Background(), lease.AcquireRequest{Candidates: c, Target: target, TTL: ttl})
}

func total(t *testing.T, h Harness, ids []string) int {
	t.Helper()
	n, err := h.Store.ActiveLeases(context.Background(), ids)
	require.NoError(t, err)
	sum := 0
	for _, x := range n {
		sum += x
	}
	return sum
}

// againstAModel runs random operations one at a time and checks every
// Acquire against a simple model: the chosen proxy is not cooling for the
// target, and has the fewest active leases among those that are not.
func againstAModel(t *testing.T, h Harness) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	proxies := []string{"a", "b", "c", "d"}
	set := indexed("model", 1, proxies...)
	targets := []string{"", "x.com", "y.com"}
	active := map[string]int{}
	cooling := map[[2]string]time.Duration{}
	leases := map[string]lease.Lease{}
	var now time.Duration // the model's time since the start
	for step := range 5000 {
		d := time.Duration(rng.IntN(3)) * time.Second
		h.Advance(d)
		now += d
		switch op := rng.IntN(10); {
		case op < 5:
			target := targets[rng.IntN(len(targets))]
			got, err := acquire(h, set, target, 24*time.Hour) // outlives the run: expiry has its own test
			fewest := -1
			for _, p := range proxies {
				if target != "" && now < cooling[[2]string{p, target}] {
					continue
				}
				if fewest == -1 || active[p] < fewest {
					fewest = active[p]
				}
			}
			if fewest == -1 {
				require.ErrorIs(t, err, lease.ErrNoProxyAvailable, "step %d", step)
				continue
			}
			require.NoError(t, err, "step %d", step)
			assert.False(t, target != "" && now < cooling[[2]string{got.ProxyID, target}], "step %d: leased a cooling proxy", step)
			assert.Equal(t, fewest, active[got.ProxyID], "step %d: not the least-loaded proxy", step)
			active[got.ProxyID]++
			assert.Equal(t, active[got.ProxyID], got.ProxyLeases, "step %d: the lease's count of its proxy's leases", step)
			leases[got.ID] = got
		case op < 8 && len(leases) > 0:
			for id, l := range leases {
				require.NoError(t, h.Store.Release(ctx, id))
				active[l.ProxyID]--
				delete(leases, id)
				break
			}
		case len(leases) > 0:
			for id, l := range leases {
				target := targets[1+rng.IntN(2)]
				require.NoError(t, h.Store.Report(ctx, id, lease.ResultRateLimited, target, time.Minute))
				key := [2]string{l.ProxyID, target}
				cooling[key] = max(cooling[key], now+time.Minute)
				break
			}
		}
		require.Equal(t, len(leases), total(t, h, proxies), "step %d", step)
	}
}

// concurrently hammers the store from many goroutines (run with -race): a
// proxy a goroutine reported rate-limited is never leased to it again for
// that target, and the counts return to zero.
func concurrently(t *testing.T, h Harness) {
	ctx := context.Background()
	var proxies []string
	for i := range 16 {
		proxies = append(proxies, fmt.Sprintf("crawl/px-%d", i))
	}
	set := indexed("all", 1, proxies...)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			target := fmt.Sprintf("site-%d.example", g)
			banned := map[string]bool{}
			for i := range 300 {
				l, err := acquire(h, set, target, time.Hour)
				if err != nil {
					assert.ErrorIs(t, err, lease.ErrNoProxyAvailable)
					assert.Len(t, banned, len(proxies), "503 only once every proxy is cooling for the target")
					continue
				}
				assert.False(t, banned[l.ProxyID], "leased %s for %s after reporting it rate-limited", l.ProxyID, target)
				if i%7 == 0 {
					assert.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultRateLimited, target, time.Hour))
					banned[l.ProxyID] = true
				}
				if _, err := h.Store.Renew(ctx, l.ID, time.Hour); err != nil {
					t.Errorf("renewing a live lease: %v", err)
				}
				assert.NoError(t, h.Store.Release(ctx, l.ID))
				assert.NoError(t, h.Store.Release(ctx, l.ID), "idempotent")
			}
		})
	}
	wg.Wait()
	assert.Zero(t, total(t, h, proxies), "every lease was released")
	// Cooldowns hold: a goroutine's banned proxies stay banned for its site.
	_, err := acquire(h, set, "site-0.example", time.Hour)
	if err == nil {
		return // site-0 did not ban them all; enough was asserted inside
	}
	assert.ErrorIs(t, err, lease.ErrNoProxyAvailable)
}

func expiry(t *testing.T, h Harness) {
	ctx := context.Background()
	short, err := acquire(h, Of("a"), "", time.Minute)
	require.NoError(t, err)
	long, err := acquire(h, Of("a"), "", time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 2, long.ProxyLeases)
	require.NoError(t, h.Store.Report(ctx, long.ID, lease.ResultRateLimited, "x.com", 10*time.Minute))

	h.Advance(2 * time.Minute)
	_, err = h.Store.Get(ctx, short.ID)
	assert.ErrorIs(t, err, lease.ErrLeaseNotFound, "gone once its TTL is up")
	assert.Equal(t, 1, total(t, h, []string{"a"}), "an expired lease no longer counts")
	_, err = acquire(h, Of("a"), "x.com", time.Hour)
	assert.ErrorIs(t, err, lease.ErrNoProxyAvailable, "still cooling for x.com")

	h.Advance(2 * time.Hour)
	assert.Zero(t, total(t, h, []string{"a"}), "no lease outlives its TTL")
	_, err = h.Store.Renew(ctx, long.ID, time.Hour)
	assert.ErrorIs(t, err, lease.ErrLeaseNotFound)
	assert.ErrorIs(t, h.Store.Report(ctx, long.ID, lease.ResultOK, "", 0), lease.ErrLeaseNotFound)
	l, err := acquire(h, Of("a"), "x.com", time.Hour)
	require.NoError(t, err, "the cooldown ended too")
	assert.Equal(t, "a", l.ProxyID)
	assert.Equal(t, 1, l.ProxyLeases)
}

func renewAndReport(t *testing.T, h Harness) {
	ctx := context.Background()
	l, err := h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: Of("a", "b"), Target: "Example.com", TTL: time.Minute, Holder: "system:serviceaccount:crawl-a:crawler"})
	require.NoError(t, err)
	assert.Equal(t, "Example.com", l.Target, "the target is kept as given")
	assert.Equal(t, "system:serviceaccount:crawl-a:crawler", l.Holder, "the holder is kept")
	assert.Equal(t, time.Minute, l.ExpiresAt.Sub(l.CreatedAt))

	h.Advance(50 * time.Second)
	renewed, err := h.Store.Renew(ctx, l.ID, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, l.CreatedAt, renewed.CreatedAt)
	assert.WithinDuration(t, l.ExpiresAt.Add(50*time.Second), renewed.ExpiresAt, time.Second, "now+ttl on the store's clock")
	h.Advance(50 * time.Second)
	got, err := h.Store.Get(ctx, l.ID)
	require.NoError(t, err, "renewed past its first expiry")
	assert.Equal(t, renewed.ExpiresAt, got.ExpiresAt)
	assert.Equal(t, l.ProxyID, got.ProxyID)
	assert.Equal(t, l.Holder, renewed.Holder, "renewed, with its holder")
	assert.Equal(t, l.Holder, got.Holder)

	// ok and error reports cool nothing; rate_limited cools for its target
	// only, and a shorter cooldown never cuts a longer one short.
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultOK, "x.com", time.Hour))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultError, "x.com", time.Hour))
	other, err := acquire(h, Of(l.ProxyID), "x.com", time.Minute)
	require.NoError(t, err, "ok and error reports put nothing in cooldown")
	require.NoError(t, h.Store.Release(ctx, other.ID))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultRateLimited, "x.com", 10*time.Minute))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultRateLimited, "x.com", time.Minute))
	_, err = acquire(h, Of(l.ProxyID), "x.com", time.Minute)
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none)
	assert.InDelta(t, (10 * time.Minute).Seconds(), none.RetryAfter.Seconds(), 1, "the longer cooldown is kept")
	_, err = acquire(h, Of(l.ProxyID), "y.com", time.Minute)
	assert.NoError(t, err, "another target is not cooling")

	require.NoError(t, h.Store.Release(ctx, l.ID))
	_, err = h.Store.Get(ctx, l.ID)
	assert.ErrorIs(t, err, lease.ErrLeaseNotFound)
	assert.ErrorIs(t, h.Store.Report(ctx, l.ID, lease.ResultRateLimited, "x.com", time.Minute), lease.ErrLeaseNotFound,
		"a released lease reports nothing")
	require.NoError(t, h.Store.Release(ctx, "never-existed"), "releasing an unknown lease is not an error")
}

func noProxyAvailable(t *testing.T, h Harness) {
	ctx := context.Background()
	_, err := acquire(h, Of(), "", time.Minute)
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none, "no candidate at all")
	assert.Zero(t, none.RetryAfter, "nothing is cooling, so no time to wait for")

	a, err := acquire(h, Of("a", "b"), "", time.Hour)
	require.NoError(t, err)
	b, err := acquire(h, Of("a", "b"), "", time.Hour)
	require.NoError(t, err)
	assert.NotEqual(t, a.ProxyID, b.ProxyID, "the least-loaded goes first")
	require.NoError(t, h.Store.Report(ctx, a.ID, lease.ResultRateLimited, "x.com", 3*time.Minute))
	require.NoError(t, h.Store.Report(ctx, b.ID, lease.ResultRateLimited, "x.com", 2*time.Minute))
	_, err = acquire(h, Of("a", "b"), "x.com", time.Minute)
	require.ErrorAs(t, err, &none)
	assert.InDelta(t, (2 * time.Minute).Seconds(), none.RetryAfter.Seconds(), 1, "until the first cooldown ends")

	h.Advance(2*time.Minute + time.Second)
	l, err := acquire(h, Of("a", "b"), "x.com", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, b.ProxyID, l.ProxyID, "the proxy whose cooldown ended")
}

func activeLeases(t *testing.T, h Harness) {
	ctx := context.Background()
	var ids []string
	for i := range 2500 { // more than one Redis script's chunk
		ids = append(ids, fmt.Sprintf("ns/px-%04d", i))
	}
	want := make([]int, len(ids))
	for _, i := range []int{0, 7, 7, 1999, 2499, 2499, 2499} {
		l, err := acquire(h, Of(ids[i]), "", time.Hour)
		require.NoError(t, err)
		assert.Equal(t, ids[i], l.ProxyID)
		want[i]++
	}
	got, err := h.Store.ActiveLeases(ctx, ids)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	got, err = h.Store.ActiveLeases(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, got)
}

// probeAsks: an ask one replica makes is read by the other, once per
// cursor, and forgotten after lease.ProbeAskMemory.
func probeAsks(t *testing.T, h Harness) {
	ctx := context.Background()
	asker, prober := h.replicas()[0], h.replicas()[1]
	asked, cursor, err := prober.ProbesAsked(ctx, 0)
	require.NoError(t, err)
	assert.Empty(t, asked, "nothing asked yet")
	require.NoError(t, asker.AskProbe(ctx, "crawl/a"))
	require.NoError(t, asker.AskProbe(ctx, "crawl/b"))
	h.Advance(time.Second)
	asked, cursor, err = prober.ProbesAsked(ctx, cursor)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"crawl/a", "crawl/b"}, asked, "the other replica reads both asks")

	h.Advance(time.Second)
	require.NoError(t, asker.AskProbe(ctx, "crawl/b"))
	h.Advance(time.Second)
	asked, _, err = prober.ProbesAsked(ctx, cursor)
	require.NoError(t, err)
	assert.Equal(t, []string{"crawl/b"}, asked, "a read after the cursor has only the newer ask")
	asked, _, err = asker.ProbesAsked(ctx, 0)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"crawl/a", "crawl/b"}, asked, "a first read has every ask within ProbeAskMemory")

	h.Advance(lease.ProbeAskMemory)
	asked, _, err = prober.ProbesAsked(ctx, 0)
	require.NoError(t, err)
	assert.Empty(t, asked, "an ask is forgotten after ProbeAskMemory, so asks never outgrow the fleet")
}

func refusals(t *testing.T, h Harness) {
	ctx := context.Background()
	last, err := h.Store.LastRefused(ctx, "crawl/eu")
	require.NoError(t, err)
	assert.True(t, last.IsZero(), "never refused")
	require.NoError(t, h.Store.NoteRefused(ctx, "crawl/eu"))
	first, err := h.Store.LastRefused(ctx, "crawl/eu")
	require.NoError(t, err)
	assert.False(t, first.IsZero())
	h.Advance(time.Minute)
	require.NoError(t, h.Store.NoteRefused(ctx, "crawl/eu"))
	second, err := h.Store.LastRefused(ctx, "crawl/eu")
	require.NoError(t, err)
	assert.InDelta(t, time.Minute.Seconds(), second.Sub(first).Seconds(), 1, "on the store's clock")
	for _, other := range []string{"crawl/us", "other/eu"} {
		last, err := h.Store.LastRefused(ctx, other)
		require.NoError(t, err)
		assert.True(t, last.IsZero(), "per pool and namespace: %s", other)
	}
	h.Advance(lease.RefusedMemory)
	forgotten, err := h.Store.LastRefused(ctx, "crawl/eu")
	require.NoError(t, err)
	assert.True(t, forgotten.IsZero(), "a refusal is forgotten after RefusedMemory, so pools that come and go leave nothing behind")
	require.NoError(t, h.Store.Ping(ctx))
}

// largeCandidateSets: with many candidates (beyond any sampling), a lease
// never goes to a proxy cooling for its target, a set whose members all
// cool answers no-proxy-available, and leases spread: no proxy holds more
// than two leases above the least-loaded one's.
func largeCandidateSets(t *testing.T, h Harness) {
	ctx := context.Background()
	var ids []string
	for i := range 300 {
		ids = append(ids, fmt.Sprintf("ns/px-%03d", i))
	}
	set := indexed("large", 1, ids...)
	count := map[string]int{}
	for range 900 {
		l, err := acquire(h, set, "", time.Hour)
		require.NoError(t, err)
		count[l.ProxyID]++
	}
	loads, err := h.Store.ActiveLeases(ctx, ids)
	require.NoError(t, err)
	assert.LessOrEqual(t, slices.Max(loads)-slices.Min(loads), 2, "leases spread over the set")
	for _, id := range ids {
		assert.Equal(t, count[id], loads[slices.Index(ids, id)])
	}

	// Cool all but one proxy for x.com: every lease for x.com goes to it.
	leaseOn := map[string]string{}
	for len(leaseOn) < len(ids) {
		l, err := acquire(h, set, "", time.Hour)
		require.NoError(t, err)
		leaseOn[l.ProxyID] = l.ID
	}
	spared := ids[123]
	for proxy, granted := range leaseOn {
		if proxy != spared {
			require.NoError(t, h.Store.Report(ctx, granted, lease.ResultRateLimited, "x.com", time.Hour))
		}
	}
	for range 5 {
		l, err := acquire(h, set, "x.com", time.Hour)
		require.NoError(t, err)
		assert.Equal(t, spared, l.ProxyID, "the only proxy not cooling for x.com")
	}
	require.NoError(t, h.Store.Report(ctx, leaseOn[spared], lease.ResultRateLimited, "x.com", 30*time.Minute))
	_, err = acquire(h, set, "x.com", time.Hour)
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none)
	assert.InDelta(t, (30 * time.Minute).Seconds(), none.RetryAfter.Seconds(), 1)
	assert.ErrorIs(t, err, lease.ErrNoProxyAvailable)
}

// hops is a route's proxies alone, without its stint.
func hops(r lease.Route) lease.Route { return lease.Route{Own: r.Own, Detour: r.Detour} }

// sessions: a gateway session's own proxy and per-host detours, what a
// report by session cools down, and the session's end when idle.
func sessions(t *testing.T, h Harness) {
	ctx := context.Background()
	route := func(session, host string) lease.Route {
		t.Helper()
		r, err := h.Store.Route(ctx, session, host)
		require.NoError(t, err)
		return r
	}
	assert.Equal(t, lease.Route{}, hops(route("s1", "shop.example")), "unknown session")
	_, err := h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultRateLimited, Target: "shop.example", Cooldown: time.Minute, Window: time.Second})
	require.ErrorIs(t, err, lease.ErrSessionNotFound)

	require.NoError(t, h.Store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p1", Own: true, Idle: 10 * time.Minute}))
	assert.Equal(t, lease.Route{Own: "p1"}, hops(route("s1", "shop.example")))
	assert.Equal(t, lease.Route{Own: "p1"}, hops(route("s1", "news.example")), "own proxy for every host")
	assert.Equal(t, lease.Route{}, hops(route("s2", "shop.example")), "per session")

	// shop.example rate-limits s1 through p1: p1 cools for that host only.
	proxy, err := h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultRateLimited, Target: "shop.example", Cooldown: 5 * time.Minute, Window: time.Second})
	require.NoError(t, err)
	assert.Equal(t, "p1", proxy)
	_, err = acquire(h, Of("p1"), "shop.example", time.Minute)
	require.ErrorIs(t, err, lease.ErrNoProxyAvailable, "p1 cools for shop.example")
	l, err := acquire(h, Of("p1"), "news.example", time.Minute)
	require.NoError(t, err, "and for that host only")
	require.NoError(t, h.Store.Release(ctx, l.ID))

	// The detour for shop.example is p2; a second report at once is the
	// same burst: it cools nothing more.
	require.NoError(t, h.Store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p2", Own: false, Idle: 10 * time.Minute}))
	proxy, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultRateLimited, Target: "shop.example", Cooldown: 5 * time.Minute, Window: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, "p1", proxy, "the burst's proxy")
	l, err = acquire(h, Of("p2"), "shop.example", time.Minute)
	require.NoError(t, err, "the detour does not cool for a late report of the same burst")
	require.NoError(t, h.Store.Release(ctx, l.ID))
	h.Advance(2 * time.Minute)
	assert.Equal(t, lease.Route{Own: "p1", Detour: "p2"}, hops(route("s1", "shop.example")))
	assert.Equal(t, lease.Route{Own: "p1"}, hops(route("s1", "news.example")))
	proxy, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultOK, Target: "shop.example", Cooldown: 0, Window: time.Second})
	require.NoError(t, err)
	assert.Equal(t, "p2", proxy, "ok is recorded against the detour, and cools nothing")
	_, err = acquire(h, Of("p2"), "shop.example", time.Minute)
	require.NoError(t, err)

	// Back on its own proxy for shop.example: the detour ends.
	require.NoError(t, h.Store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p3", Own: true, Idle: 10 * time.Minute}))
	assert.Equal(t, lease.Route{Own: "p3"}, hops(route("s1", "shop.example")))

	// Idle past its time, the session is gone; each route extends it.
	h.Advance(9 * time.Minute)
	require.NoError(t, h.Store.SetRoute(ctx, "s1", "news.example", lease.RouteSet{Proxy: "p3", Own: true, Idle: 10 * time.Minute}))
	h.Advance(9 * time.Minute)
	assert.Equal(t, lease.Route{Own: "p3"}, hops(route("s1", "shop.example")), "extended by the last route")
	h.Advance(2 * time.Minute)
	assert.Equal(t, lease.Route{}, hops(route("s1", "shop.example")), "idle for 11 minutes")
	_, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultRateLimited, Target: "shop.example", Cooldown: time.Minute, Window: time.Second})
	require.ErrorIs(t, err, lease.ErrSessionNotFound)
}

// sessionScores: a stint's error score and uses, from reports and marks,
// on either replica; only the session's own proxy's answers count; a new
// stint starts from nothing.
func sessionScores(t *testing.T, h Harness) {
	ctx := context.Background()
	store, replica := h.replicas()[0], h.replicas()[1]
	route := func() lease.Route {
		t.Helper()
		r, err := replica.Route(ctx, "s1", "shop.example")
		require.NoError(t, err)
		return r
	}
	_, err := store.MarkSession(ctx, "s1", "p1", 1)
	require.ErrorIs(t, err, lease.ErrSessionNotFound)

	for range 3 {
		require.NoError(t, store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p1", Own: true, Idle: 10 * time.Minute}))
	}
	assert.Equal(t, int64(3), route().Uses, "three tunnels on the stint")
	assert.Zero(t, route().Score)

	score, err := replica.MarkSession(ctx, "s1", "p1", 1)
	require.NoError(t, err)
	assert.InDelta(t, 1.0, score, 1e-9)
	score, err = store.MarkSession(ctx, "s1", "p9", 1)
	require.NoError(t, err)
	assert.InDelta(t, 1.0, score, 1e-9, "another proxy's answer is not the stint's")
	report := lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultRateLimited, Target: "shop.example", Window: time.Minute, Score: 0.5}
	_, err = store.ReportSession(ctx, report)
	require.NoError(t, err)
	_, err = store.ReportSession(ctx, report)
	require.NoError(t, err)
	assert.InDelta(t, 1.5, route().Score, 1e-9, "the same burst counts once")
	_, err = store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultOK, Target: "shop.example", Window: time.Minute, Score: -0.5})
	require.NoError(t, err)
	assert.InDelta(t, 1.0, route().Score, 1e-9, "a success decays it")
	score, err = store.MarkSession(ctx, "s1", "p1", -5)
	require.NoError(t, err)
	assert.Zero(t, score, "never below 0")

	// A detour's refusals are the detour's.
	require.NoError(t, store.SetRoute(ctx, "s1", "news.example", lease.RouteSet{Proxy: "p2", Own: false, Idle: 10 * time.Minute}))
	_, err = store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "platform", Result: lease.ResultBlocked, Target: "news.example", Window: time.Minute, Score: 1})
	require.NoError(t, err)
	assert.Zero(t, route().Score)

	_, err = store.MarkSession(ctx, "s1", "p1", 2)
	require.NoError(t, err)
	require.NoError(t, store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p3", Own: true, Idle: 10 * time.Minute}))
	r := route()
	assert.Zero(t, r.Score, "a new stint starts clean")
	assert.Equal(t, int64(1), r.Uses)
	require.NoError(t, store.SetRoute(ctx, "s1", "shop.example", lease.RouteSet{Proxy: "p3", Own: true, Fresh: true, Idle: 10 * time.Minute}))
	assert.Equal(t, int64(1), route().Uses, "so does a fresh one on the same proxy")
}

// usageRows: usage counted on either replica adds up per tenant, host,
// provider and day; a read covers the days asked for; a tenant's day keeps
// MaxUsageHosts hosts apart and counts the rest together.
func usageRows(t *testing.T, h Harness) {
	ctx := context.Background()
	store, replica := h.replicas()[0], h.replicas()[1]
	a := lease.UsageKey{Day: "2026-12-05", Tenant: "team-a", Host: "shop.example", Provider: "gcp-eu"}
	require.NoError(t, store.CountUsage(ctx, a, lease.UsageCounts{Leases: 1, ProxyMillis: 300_000}, time.Hour*24*30))
	require.NoError(t, replica.CountUsage(ctx, a, lease.UsageCounts{Tunnels: 2, BytesUp: 100, BytesDown: 5000, Blocks: 1}, time.Hour*24*30))
	b := lease.UsageKey{Day: "2026-12-06", Tenant: "team-b", Host: "news.example", Provider: lease.ProviderExternal}
	require.NoError(t, store.CountUsage(ctx, b, lease.UsageCounts{Requests: 3, PushBacks: 2}, time.Hour*24*30))

	rows, err := replica.ReadUsage(ctx, "2026-12-05", "2026-12-06")
	require.NoError(t, err)
	assert.Equal(t, map[lease.UsageKey]lease.UsageCounts{
		a: {Leases: 1, Tunnels: 2, BytesUp: 100, BytesDown: 5000, Blocks: 1, ProxyMillis: 300_000},
		b: {Requests: 3, PushBacks: 2},
	}, rows)
	rows, err = store.ReadUsage(ctx, "2026-12-06", "2026-12-07")
	require.NoError(t, err)
	assert.Equal(t, map[lease.UsageKey]lease.UsageCounts{b: {Requests: 3, PushBacks: 2}}, rows, "only the days asked for")

	// A tenant making up hosts: the first MaxUsageHosts kept apart (shop.example among them), the rest together.
	for i := range lease.MaxUsageHosts + 5 {
		k := lease.UsageKey{Day: "2026-12-05", Tenant: "team-a", Host: fmt.Sprintf("h%d.example", i), Provider: "gcp-eu"}
		require.NoError(t, store.CountUsage(ctx, k, lease.UsageCounts{Tunnels: 1}, time.Hour*24*30))
	}
	rows, err = store.ReadUsage(ctx, "2026-12-05", "2026-12-05")
	require.NoError(t, err)
	hosts := 0
	for k := range rows {
		if k.Tenant == "team-a" && k.Host != lease.UsageOtherHost {
			hosts++
		}
	}
	assert.Equal(t, lease.MaxUsageHosts, hosts)
	assert.Equal(t, int64(6), rows[lease.UsageKey{Day: "2026-12-05", Tenant: "team-a", Host: lease.UsageOtherHost, Provider: "gcp-eu"}].Tunnels)
}
