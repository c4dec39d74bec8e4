package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/lease"
)

var (
	served  = lease.Outcome{Source: lease.OutcomeCanary}
	blocked = lease.Outcome{Blocked: true, Source: lease.OutcomeCanary}
)

func record(t *testing.T, h Harness, proxy, host string, o lease.Outcome, n int) {
	t.Helper()
	for range n {
		require.NoError(t, h.Store.RecordOutcome(context.Background(), proxy, host, o))
	}
}

func recordOf(t *testing.T, h Harness, proxy, host string) (lease.HostRecord, bool) {
	t.Helper()
	records, err := h.Store.Outcomes(context.Background(), proxy)
	require.NoError(t, err)
	for _, r := range records {
		if r.Host == host {
			return r, true
		}
	}
	return lease.HostRecord{}, false
}

// outcomeMemory: each (proxy, host) keeps its served and blocked outcomes,
// weights halving every OutcomeHalfLife, its last block and what saw it;
// Blocks lists the last blocks since a time; a record is forgotten
// OutcomeRetention after its last outcome, and a proxy keeps at most
// MaxHostRecords hosts, the oldest going first.
func outcomeMemory(t *testing.T, h Harness) {
	ctx := context.Background()
	record(t, h, "a", "shop.example", served, 3)
	record(t, h, "a", "shop.example", blocked, 1)
	record(t, h, "b", "news.example", lease.Outcome{Blocked: true, Source: lease.OutcomeGateway}, 2)
	r, ok := recordOf(t, h, "a", "shop.example")
	require.True(t, ok)
	assert.InDelta(t, 3, r.Served, 0.01)
	assert.InDelta(t, 1, r.Blocked, 0.01)
	assert.Equal(t, lease.OutcomeCanary, r.LastBlockedBy)
	assert.False(t, r.LastBlocked.IsZero())

	h.Advance(lease.OutcomeHalfLife)
	r, _ = recordOf(t, h, "a", "shop.example")
	assert.InDelta(t, 1.5, r.Served, 0.01, "a half-life halves the weights")
	assert.InDelta(t, 0.5, r.Blocked, 0.01)
	record(t, h, "a", "shop.example", served, 1)
	r, _ = recordOf(t, h, "a", "shop.example")
	assert.InDelta(t, 2.5, r.Served, 0.01, "a new outcome adds to the decayed weight")

	blocks, err := h.Store.Blocks(ctx, time.Time{})
	require.NoError(t, err)
	byPair := map[string]lease.Block{}
	for _, b := range blocks {
		byPair[b.Proxy+" "+b.Host] = b
	}
	require.Len(t, byPair, 2, "%v", blocks)
	assert.Equal(t, lease.OutcomeGateway, byPair["b news.example"].By)
	blocks, err = h.Store.Blocks(ctx, r.At)
	require.NoError(t, err)
	assert.Empty(t, blocks, "no block since the last outcome")

	// A push-back (a 429) weighs like a block in the record, but is no
	// block: Blocks leaves it out.
	record(t, h, "d", "shop.example", lease.Outcome{Blocked: true, Limited: true, Source: lease.OutcomeReport}, 1)
	r, _ = recordOf(t, h, "d", "shop.example")
	assert.InDelta(t, 1, r.Blocked, 0.01)
	assert.True(t, r.LastBlocked.IsZero(), "a push-back is no block")
	blocks, err = h.Store.Blocks(ctx, time.Time{})
	require.NoError(t, err)
	for _, b := range blocks {
		assert.NotEqual(t, "d", b.Proxy, "a push-back is no block")
	}

	h.Advance(lease.OutcomeRetention)
	_, ok = recordOf(t, h, "a", "shop.example")
	assert.False(t, ok, "forgotten after OutcomeRetention")
	blocks, err = h.Store.Blocks(ctx, time.Time{})
	require.NoError(t, err)
	assert.Empty(t, blocks)

	for i := range lease.MaxHostRecords + 1 {
		record(t, h, "c", fmt.Sprintf("h%02d.example", i), served, 1)
		h.Advance(time.Millisecond)
	}
	records, err := h.Store.Outcomes(ctx, "c")
	require.NoError(t, err)
	assert.Len(t, records, lease.MaxHostRecords)
	_, ok = recordOf(t, h, "c", "h00.example")
	assert.False(t, ok, "the oldest host went first")
}

// outcomeCooldown: a blocked outcome with a cooldown keeps its proxy away
// from that host only, and the record says what saw it.
func outcomeCooldown(t *testing.T, h Harness) {
	ctx := context.Background()
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Blocked: true, Source: lease.OutcomeCanary, Cooldown: time.Minute}))
	_, err := acquire(h, Of("a"), "shop.example", time.Minute)
	noneAvailable(t, err, lease.CauseCooling)
	l, err := acquire(h, Of("a"), "news.example", time.Minute)
	require.NoError(t, err, "another host may use it")
	assert.Equal(t, "a", l.ProxyID)
	r, _ := recordOf(t, h, "a", "shop.example")
	assert.Equal(t, lease.OutcomeCanary, r.LastBlockedBy)
	h.Advance(time.Minute + time.Second)
	_, err = acquire(h, Of("a"), "shop.example", time.Minute)
	require.NoError(t, err, "the cooldown ended")
}

// endCooldown: a canary's hold on a proxy for a host ends when the canary
// says so, not a moment later; a longer cooldown (a site's Retry-After)
// is not ended by it, nor is another host's.
func endCooldown(t *testing.T, h Harness) {
	ctx := context.Background()
	hold := time.Hour
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Blocked: true, Source: lease.OutcomeCanary, Cooldown: hold}))
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "news.example", lease.Outcome{Blocked: true, Source: lease.OutcomeCanary, Cooldown: hold}))
	first, err := acquire(h, Of("b"), "", time.Minute) // the store's now
	require.NoError(t, err)
	heldUntil := first.CreatedAt.Add(hold + time.Second)

	require.NoError(t, h.Store.EndCooldown(ctx, "a", "shop.example", heldUntil))
	l, err := acquire(h, Of("a"), "shop.example", time.Minute)
	require.NoError(t, err, "the hold ended")
	assert.Equal(t, "a", l.ProxyID)
	_, err = acquire(h, Of("a"), "news.example", time.Minute)
	noneAvailable(t, err, lease.CauseCooling)

	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultRateLimited, "shop.example", 2*hold))
	require.NoError(t, h.Store.EndCooldown(ctx, "a", "shop.example", heldUntil))
	_, err = acquire(h, Of("a"), "shop.example", time.Minute)
	noneAvailable(t, err, lease.CauseCooling)
	require.NoError(t, h.Store.EndCooldown(ctx, "b", "shop.example", heldUntil), "ending what is not there is fine")
}

// forgetProxy: a proxy that moved starts clean: no cooldown, no record,
// no block; another proxy's are kept.
func forgetProxy(t *testing.T, h Harness) {
	ctx := context.Background()
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", blocked))
	require.NoError(t, h.Store.RecordOutcome(ctx, "b", "shop.example", lease.Outcome{Blocked: true, Source: lease.OutcomeCanary, Cooldown: time.Hour}))
	_, err := acquire(h, Of("b"), "shop.example", time.Minute)
	noneAvailable(t, err, lease.CauseCooling)
	require.NoError(t, h.Store.ForgetProxy(ctx, "b"))
	l, err := acquire(h, Of("a", "b"), "shop.example", time.Minute)
	require.NoError(t, err, "b's cooldown is gone")
	assert.Equal(t, "b", l.ProxyID)
	assert.Equal(t, lease.WhyBetterRecord, l.Why, "b has no record any more, a has")
	_, ok := recordOf(t, h, "b", "shop.example")
	assert.False(t, ok)
	blocks, err := h.Store.Blocks(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, blocks, 1)
	assert.Equal(t, "a", blocks[0].Proxy)
}

// reportsRecordOutcomes: a report on a lease or a gateway session adds to
// its proxy's record with the target: ok served, rate_limited a push-back
// and blocked a block (both refusals, both cooling the proxy for the
// target), error nothing.
func reportsRecordOutcomes(t *testing.T, h Harness) {
	ctx := context.Background()
	l, err := acquire(h, Of("a"), "", time.Minute)
	require.NoError(t, err)
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultOK, "shop.example", time.Minute))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultError, "shop.example", time.Minute))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultBlocked, "shop.example", time.Minute))
	r, ok := recordOf(t, h, "a", "shop.example")
	require.True(t, ok)
	assert.InDelta(t, 1, r.Served, 0.01)
	assert.InDelta(t, 1, r.Blocked, 0.01)
	assert.Equal(t, lease.OutcomeReport, r.LastBlockedBy)
	_, err = acquire(h, Of("a"), "shop.example", time.Minute)
	noneAvailable(t, err, lease.CauseCooling)

	require.NoError(t, h.Store.SetRoute(ctx, "s1", "news.example", lease.RouteSet{Proxy: "b", Own: true, Idle: time.Minute}))
	_, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "team-b", Result: lease.ResultOK, Target: "news.example", Cooldown: time.Minute, Window: time.Second})
	require.NoError(t, err)
	_, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "team-b", Result: lease.ResultRateLimited, Target: "news.example", Cooldown: time.Minute, Window: time.Second})
	require.NoError(t, err)
	_, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "s1", Reporter: "team-b", Result: lease.ResultRateLimited, Target: "news.example", Cooldown: time.Minute, Window: time.Second})
	require.NoError(t, err)
	r, ok = recordOf(t, h, "b", "news.example")
	require.True(t, ok)
	assert.InDelta(t, 1, r.Served, 0.01)
	assert.InDelta(t, 1, r.Blocked, 0.01, "a burst of refusals is one block")
}

// voices: a block keeps who reported it (a lease's holder, a session's
// tenant, an outcome's Reporter, "" for a canary), the latest block of
// each first, at most MaxVoices of them; Blocks carries them to the ban
// judge. Push-backs and served outcomes add none.
func voices(t *testing.T, h Harness) {
	ctx := context.Background()
	l, err := h.Store.Acquire(ctx, lease.AcquireRequest{Candidates: Of("a"), TTL: time.Minute, Holder: "team-a"})
	require.NoError(t, err)
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultBlocked, "shop.example", time.Second))
	h.Advance(time.Second)
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Blocked: true, Source: lease.OutcomeGateway, Reporter: "team-b"}))
	h.Advance(time.Second)
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Blocked: true, Limited: true, Source: lease.OutcomeReport, Reporter: "team-c"}))
	require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Source: lease.OutcomeReport, Reporter: "team-d"}))
	require.NoError(t, h.Store.Report(ctx, l.ID, lease.ResultBlocked, "shop.example", time.Second))
	r, ok := recordOf(t, h, "a", "shop.example")
	require.True(t, ok)
	whos := func(vs []lease.Voice) []string {
		var out []string
		for _, v := range vs {
			out = append(out, v.Who)
		}
		return out
	}
	assert.Equal(t, []string{"team-a", "team-b"}, whos(r.Voices), "team-a's second block moves it first; a push-back and a success are no voice")
	assert.Equal(t, r.LastBlocked.UnixMilli(), r.Voices[0].At.UnixMilli(), "a voice is dated by its block")
	assert.WithinDuration(t, r.Voices[0].At.Add(-time.Second), r.Voices[1].At, 50*time.Millisecond, "team-b's a second earlier")

	for _, who := range []string{"", "team-e", "team-f", "team-g"} {
		require.NoError(t, h.Store.RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Blocked: true, Source: lease.OutcomeCanary, Reporter: who}))
	}
	blocks, err := h.Store.Blocks(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, blocks, 1)
	assert.Equal(t, []string{"team-g", "team-f", "team-e", ""}, whos(blocks[0].Voices), "at most MaxVoices, the oldest gone")
	require.Len(t, blocks[0].Voices, lease.MaxVoices)

	require.NoError(t, h.Store.SetRoute(ctx, "team-h/s1", "news.example", lease.RouteSet{Proxy: "b", Own: true, Idle: time.Minute}))
	_, err = h.Store.ReportSession(ctx, lease.SessionReport{Session: "team-h/s1", Reporter: "team-h", Result: lease.ResultBlocked, Target: "news.example", Cooldown: time.Minute, Window: time.Second})
	require.NoError(t, err)
	r, _ = recordOf(t, h, "b", "news.example")
	assert.Equal(t, []string{"team-h"}, whos(r.Voices), "a session's report is its tenant's voice")
}

// betterRecord: among the least-loaded candidates, a lease for a host goes
// to the one the host blocked least lately, and says so; fewer leases
// still come first, another host is not concerned, and a block decays
// until it no longer counts.
func betterRecord(t *testing.T, h Harness) {
	record(t, h, "a", "shop.example", blocked, 2)
	record(t, h, "b", "shop.example", blocked, 1)
	set := Of("a", "b", "c")
	l, err := acquire(h, set, "shop.example", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "c", l.ProxyID, "c was never blocked by shop.example")
	assert.Equal(t, lease.WhyBetterRecord, l.Why)
	l, err = acquire(h, set, "shop.example", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "b", l.ProxyID, "of a and b (no lease each), b was blocked less")
	l, err = acquire(h, set, "news.example", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "a", l.ProxyID, "another host: least-loaded alone")
	assert.Equal(t, lease.WhyLeastLoaded, l.Why)

	h.Advance(20 * lease.OutcomeHalfLife / 2)
	fresh := Of("a", "x")
	l, err = acquire(h, fresh, "shop.example", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, lease.WhyLeastLoaded, l.Why, "ten half-lives on, the blocks no longer count")
}

// burnedIPs: an IP burned in a scope stays burned there until its
// retention ends, and only there; burning it again never shortens it.
func burnedIPs(t *testing.T, h Harness) {
	ctx := context.Background()
	require.NoError(t, h.Store.BurnIP(ctx, "gcp-eu", "203.0.113.7", time.Hour))
	require.NoError(t, h.Store.BurnIP(ctx, "gcp-eu", "203.0.113.7", time.Minute))
	until, err := h.Store.BurnedUntil(ctx, "gcp-eu", "203.0.113.7")
	require.NoError(t, err)
	assert.False(t, until.IsZero())
	other, err := h.Store.BurnedUntil(ctx, "gcp-us", "203.0.113.7")
	require.NoError(t, err)
	assert.True(t, other.IsZero(), "burned per provider instance")
	h.Advance(30 * time.Minute)
	until2, err := h.Store.BurnedUntil(ctx, "gcp-eu", "203.0.113.7")
	require.NoError(t, err)
	assert.Equal(t, until.UnixMilli(), until2.UnixMilli(), "a shorter burn kept the longer retention")
	h.Advance(31 * time.Minute)
	gone, err := h.Store.BurnedUntil(ctx, "gcp-eu", "203.0.113.7")
	require.NoError(t, err)
	assert.True(t, gone.IsZero(), "retention over")
}

// clients: a block keeps the fingerprint of the client whose request it
// was in its voice, a success keeps it among the record's passes (the
// latest of each client first, at most MaxVoices), and Blocks carries
// both to the ban judge; a session's report carries its client, read from
// either replica.
func clients(t *testing.T, h Harness) {
	ctx := context.Background()
	const banned, other = "t13d1516h2_aaaaaaaaaaaa_bbbbbbbbbbbb", "t13d1311h2_cccccccccccc_dddddddddddd"
	stores := h.replicas()
	require.NoError(t, stores[0].RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Source: lease.OutcomeReport, Reporter: "team-a", Client: banned}))
	h.Advance(time.Second)
	require.NoError(t, stores[1].RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Source: lease.OutcomeCanary, Client: lease.ClientCanary}))
	require.NoError(t, stores[0].RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Source: lease.OutcomeReport, Reporter: "team-b"}))
	h.Advance(time.Second)
	require.NoError(t, stores[0].SetRoute(ctx, "team-a/s1", "shop.example", lease.RouteSet{Proxy: "a", Own: true, Idle: time.Minute}))
	_, err := stores[1].ReportSession(ctx, lease.SessionReport{Session: "team-a/s1", Reporter: "team-a", Result: lease.ResultBlocked,
		Target: "shop.example", Client: banned, Cooldown: time.Minute, Window: time.Second})
	require.NoError(t, err)
	h.Advance(time.Second)
	require.NoError(t, stores[1].RecordOutcome(ctx, "a", "shop.example", lease.Outcome{Source: lease.OutcomeReport, Reporter: "team-c", Client: other}))

	r, ok := recordOf(t, h, "a", "shop.example")
	require.True(t, ok)
	require.Len(t, r.Voices, 1)
	assert.Equal(t, banned, r.Voices[0].Client, "the block's voice names its client")
	var passed []string
	for _, p := range r.Passes {
		passed = append(passed, p.Client)
	}
	assert.Equal(t, []string{other, lease.ClientCanary, banned}, passed, "the latest success of each known client first; an unknown client is none")
	assert.WithinDuration(t, r.Voices[0].At.Add(time.Second), r.Passes[0].At, 50*time.Millisecond)
	assert.Equal(t, []string{"team-c", "", "team-a"}, []string{r.Passes[0].Who, r.Passes[1].Who, r.Passes[2].Who}, "each pass names its reporter")

	blocks, err := stores[1].Blocks(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, blocks, 1)
	assert.Equal(t, r.Voices, blocks[0].Voices)
	assert.Equal(t, r.Passes, blocks[0].Passes)

	for i := range lease.MaxVoices + 1 {
		require.NoError(t, stores[i%2].RecordOutcome(ctx, "b", "shop.example", lease.Outcome{Source: lease.OutcomeReport, Client: fmt.Sprintf("client-%d", i)}))
	}
	r, _ = recordOf(t, h, "b", "shop.example")
	assert.Len(t, r.Passes, lease.MaxVoices, "at most MaxVoices passes")
	assert.Equal(t, fmt.Sprintf("client-%d", lease.MaxVoices), r.Passes[0].Client)
}

// clientBans: a host's mark on a client is seen from either replica until
// it ends; a later end is kept, an earlier one changes nothing.
func clientBans(t *testing.T, h Harness) {
	ctx := context.Background()
	stores := h.replicas()
	bans := func(s lease.Store) map[string]time.Time {
		got, err := s.ClientBans(ctx)
		require.NoError(t, err)
		out := map[string]time.Time{}
		for _, b := range got {
			out[b.Host+"|"+b.Client] = b.Until
		}
		return out
	}
	assert.Empty(t, bans(stores[0]))
	require.NoError(t, stores[0].MarkClientBan(ctx, "shop.example", "fp1", 10*time.Minute))
	require.NoError(t, stores[1].MarkClientBan(ctx, "shop.example", "fp1", 5*time.Minute))
	require.NoError(t, stores[1].MarkClientBan(ctx, "news.example", "fp2", 20*time.Minute))
	got := bans(stores[1])
	require.Len(t, got, 2)
	assert.WithinDuration(t, got["shop.example|fp1"].Add(10*time.Minute), got["news.example|fp2"], 100*time.Millisecond,
		"the shop's later end is kept")
	h.Advance(15 * time.Minute)
	got = bans(stores[0])
	assert.Len(t, got, 1, "the shop's mark ended")
	assert.Contains(t, got, "news.example|fp2")
}
