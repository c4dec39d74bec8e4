package pool

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// serving is an updated member, Ready long enough to be available, created
// an hour before t0.
func serving(name, zone string) Member {
	return Member{Name: name, Zone: zone, Updated: true, Created: t0.Add(-time.Hour), Ready: true, ReadySince: t0.Add(-50 * time.Minute)}
}

func members(prefix, zone string, n int, edit func(*Member)) []Member {
	var out []Member
	for i := range n {
		m := serving(fmt.Sprintf("%s%d", prefix, i), zone)
		if edit != nil {
			edit(&m)
		}
		out = append(out, m)
	}
	return out
}

func concat(lists ...[]Member) []Member {
	var out []Member
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

var (
	outdated = func(m *Member) { m.Updated = false }
	booting  = func(m *Member) { m.Ready = false; m.Created = t0.Add(-time.Minute) }
	sick     = func(m *Member) { m.Ready, m.Sick = false, true }
	banned   = func(m *Member) { m.Banned = true }
)

func TestDecide(t *testing.T) {
	zones := []string{"a", "b", "c"}
	cases := []struct {
		name string
		in   Input
		// want are the zones created and the members deleted (with cause).
		wantCreate []string
		wantDelete []Retirement
		wantCounts [5]int // replicas, ready, available, updated, recycling
		settled    bool
	}{
		{
			name:       "an empty pool of 6 over 3 zones is created 2/2/2 at once",
			in:         Input{Replicas: 6, Zones: zones, MaxSurge: 1},
			wantCreate: []string{"a", "b", "c", "a", "b", "c"},
		},
		{
			name:       "without zones, members are created without one",
			in:         Input{Replicas: 2, MaxSurge: 1},
			wantCreate: []string{"", ""},
		},
		{
			name:       "scale up from 6 to 9 adds one per zone",
			in:         Input{Replicas: 9, Zones: zones, MaxSurge: 1, Members: concat(members("a", "a", 2, nil), members("b", "b", 2, nil), members("c", "c", 2, nil))},
			wantCreate: []string{"a", "b", "c"},
			wantCounts: [5]int{6, 6, 6, 6, 0},
		},
		{
			name:       "scale up to 7 gives the odd member to the first zone",
			in:         Input{Replicas: 7, Zones: zones, MaxSurge: 1, Members: concat(members("a", "a", 2, nil), members("b", "b", 2, nil), members("c", "c", 2, nil))},
			wantCreate: []string{"a"},
			wantCounts: [5]int{6, 6, 6, 6, 0},
		},
		{
			name: "scale down from 9 to 6 removes one per zone, the oldest",
			in: Input{Replicas: 6, Zones: zones, MaxSurge: 1, Members: concat(
				members("a", "a", 3, func(m *Member) { m.Created = t0.Add(-time.Duration(len(m.Name)) * time.Hour) }),
				members("b", "b", 3, nil), members("c", "c", 3, nil))},
			wantDelete: []Retirement{{"a0", CauseScaleDown}, {"b0", CauseScaleDown}, {"c0", CauseScaleDown}},
			wantCounts: [5]int{9, 9, 9, 9, 0},
		},
		{
			name: "scale down removes an unavailable member before an available one",
			in: Input{Replicas: 2, MaxSurge: 1, Members: concat(
				members("up", "", 2, nil), members("down", "", 1, booting))},
			wantDelete: []Retirement{{"down0", CauseScaleDown}},
			wantCounts: [5]int{3, 2, 2, 3, 0},
		},
		{
			name: "an uneven pool is rebalanced, surge first",
			in: Input{Replicas: 6, Zones: zones, MaxSurge: 1, Members: concat(
				members("a", "a", 4, nil), members("b", "b", 1, nil), members("c", "c", 1, nil))},
			// a keeps 2, two of its members are surplus; the first
			// successor goes to b (c waits for the surge).
			wantCreate: []string{"b"},
			wantCounts: [5]int{6, 6, 6, 6, 2},
		},
		{
			name: "a rebalance retires a surplus member once the budget allows",
			in: Input{Replicas: 6, Zones: zones, MaxSurge: 1, Members: concat(
				members("a", "a", 4, nil), members("b", "b", 2, nil), members("c", "c", 1, nil))},
			wantDelete: []Retirement{{"a0", CauseZoneRebalance}},
			wantCounts: [5]int{7, 7, 7, 7, 2},
		},
		{
			name: "a member in a zone no longer listed is replaced",
			in: Input{Replicas: 2, Zones: []string{"a", "b"}, MaxSurge: 1, Members: concat(
				members("a", "a", 1, nil), members("old", "x", 1, nil))},
			wantCreate: []string{"b"},
			wantCounts: [5]int{2, 2, 2, 2, 1},
		},
		{
			name:       "template change, maxSurge 1: one successor first, nothing deleted",
			in:         Input{Replicas: 3, MaxSurge: 1, Members: members("old", "", 3, outdated)},
			wantCreate: []string{""},
			wantCounts: [5]int{3, 3, 3, 0, 3},
		},
		{
			name: "template change: the old member waits while its successor is not available",
			in: Input{Replicas: 3, MaxSurge: 1, Members: concat(
				members("old", "", 3, outdated), members("new", "", 1, booting))},
			wantCounts: [5]int{4, 3, 3, 1, 3},
		},
		{
			name: "template change: once the successor is available, one old member goes",
			in: Input{Replicas: 3, MaxSurge: 1, Members: concat(
				members("old", "", 3, outdated), members("new", "", 1, nil))},
			wantDelete: []Retirement{{"old0", CauseTemplateChanged}},
			wantCounts: [5]int{4, 4, 4, 1, 3},
		},
		{
			name:       "maxSurge 0, maxUnavailable 1: one old member goes first",
			in:         Input{Replicas: 3, MaxUnavailable: 1, Members: members("old", "", 3, outdated)},
			wantDelete: []Retirement{{"old0", CauseTemplateChanged}},
			wantCounts: [5]int{3, 3, 3, 0, 3},
		},
		{
			name:       "maxSurge 0, maxUnavailable 1: then its successor",
			in:         Input{Replicas: 3, MaxUnavailable: 1, Members: members("old", "", 2, outdated)},
			wantCreate: []string{""},
			wantCounts: [5]int{2, 2, 2, 0, 2},
		},
		{
			name:       "maxSurge 2 surges two at once",
			in:         Input{Replicas: 4, MaxSurge: 2, Members: members("old", "", 4, outdated)},
			wantCreate: []string{"", ""},
			wantCounts: [5]int{4, 4, 4, 0, 4},
		},
		{
			name: "minReadySeconds: a Ready successor is not available yet, nothing retires",
			in: Input{Replicas: 1, MaxSurge: 1, MinReady: 30 * time.Second, Members: concat(
				members("old", "", 1, outdated),
				members("new", "", 1, func(m *Member) { m.ReadySince = t0.Add(-10 * time.Second) }))},
			wantCounts: [5]int{2, 2, 1, 1, 1},
		},
		{
			name: "age: a member past maxAge is recycled, surge first",
			in: Input{Replicas: 2, MaxSurge: 1, MaxAge: 30 * time.Minute, Members: concat(
				members("old", "", 1, nil),
				members("young", "", 1, func(m *Member) { m.Created = t0.Add(-10 * time.Minute) }))},
			wantCreate: []string{""},
			wantCounts: [5]int{2, 2, 2, 2, 1},
		},
		{
			name: "age: jitter shortens a member's life by its share",
			in: Input{Replicas: 2, MaxSurge: 1, MaxAge: 100 * time.Minute, JitterPercent: 50, Members: concat(
				// 70 minutes old: past 100m * (1 - 0.8*0.5) = 60m.
				members("jittered", "", 1, func(m *Member) { m.Created, m.Jitter = t0.Add(-70*time.Minute), 0.8 }),
				// 70 minutes old and no jitter: 30 more minutes.
				members("plain", "", 1, func(m *Member) { m.Created = t0.Add(-70 * time.Minute) }))},
			wantCreate: []string{""},
			wantCounts: [5]int{2, 2, 2, 2, 1},
		},
		{
			name: "age: the expired member goes once its successor is available",
			in: Input{Replicas: 1, MaxSurge: 1, MaxAge: 30 * time.Minute, Members: concat(
				members("old", "", 1, nil),
				members("new", "", 1, func(m *Member) { m.Created = t0.Add(-5 * time.Minute) }))},
			wantDelete: []Retirement{{"old0", CauseMaxAge}},
			wantCounts: [5]int{2, 2, 2, 2, 1},
		},
		{
			name:       "a sick member gets a successor first",
			in:         Input{Replicas: 3, MaxSurge: 1, Members: concat(members("ok", "", 2, nil), members("sick", "", 1, sick))},
			wantCreate: []string{""},
			wantCounts: [5]int{3, 2, 2, 3, 1},
		},
		{
			name:       "a banned member gets a successor first, and serves meanwhile",
			in:         Input{Replicas: 3, MaxSurge: 1, Members: concat(members("ok", "", 2, nil), members("banned", "", 1, banned))},
			wantCreate: []string{""},
			wantCounts: [5]int{3, 3, 3, 3, 1},
		},
		{
			name: "a banned member goes once its successor is available",
			in: Input{Replicas: 3, MaxSurge: 1, Members: concat(
				members("ok", "", 2, nil), members("banned", "", 1, banned), members("new", "", 1, nil))},
			wantDelete: []Retirement{{"banned0", CauseBanned}},
			wantCounts: [5]int{4, 4, 4, 4, 1},
		},
		{
			name: "a sick member goes once its successor is available",
			in: Input{Replicas: 3, MaxSurge: 1, Members: concat(
				members("ok", "", 2, nil), members("sick", "", 1, sick), members("new", "", 1, nil))},
			wantDelete: []Retirement{{"sick0", CauseUnhealthy}},
			wantCounts: [5]int{4, 3, 3, 4, 1},
		},
		{
			name:       "maxUnavailable 1: a sick member goes at once, it costs no availability",
			in:         Input{Replicas: 3, MaxUnavailable: 1, Members: concat(members("ok", "", 2, nil), members("sick", "", 1, sick))},
			wantDelete: []Retirement{{"sick0", CauseUnhealthy}},
			wantCounts: [5]int{3, 2, 2, 3, 1},
		},
		{
			name: "one budget: a sick member, an old one and a template change share one surge",
			in: Input{Replicas: 4, MaxSurge: 1, MaxAge: 30 * time.Minute, Members: concat(
				members("sick", "", 1, func(m *Member) { sick(m); m.Created = t0.Add(-5 * time.Minute) }),
				members("old", "", 1, nil),
				members("outdated", "", 1, func(m *Member) { outdated(m); m.Created = t0.Add(-5 * time.Minute) }),
				members("fine", "", 1, func(m *Member) { m.Created = t0.Add(-5 * time.Minute) }))},
			wantCreate: []string{""},
			wantCounts: [5]int{4, 3, 3, 3, 3},
		},
		{
			name: "one budget: with the surge spent and the successor available, the sick member goes first",
			in: Input{Replicas: 4, MaxSurge: 1, MaxAge: 30 * time.Minute, Members: concat(
				members("sick", "", 1, func(m *Member) { sick(m); m.Created = t0.Add(-5 * time.Minute) }),
				members("old", "", 1, nil),
				members("outdated", "", 1, func(m *Member) { outdated(m); m.Created = t0.Add(-5 * time.Minute) }),
				members("fine", "", 2, func(m *Member) { m.Created = t0.Add(-5 * time.Minute) }))},
			wantDelete: []Retirement{{"sick0", CauseUnhealthy}},
			wantCounts: [5]int{5, 4, 4, 4, 3},
		},
		{
			name: "the floor holds: with every member outdated and one sick, no available member goes below replicas - maxUnavailable",
			in: Input{Replicas: 3, MaxUnavailable: 1, Members: concat(
				members("old", "", 2, outdated), members("sick", "", 1, func(m *Member) { outdated(m); sick(m) }))},
			wantDelete: []Retirement{{"sick0", CauseUnhealthy}},
			wantCounts: [5]int{3, 2, 2, 0, 3},
		},
		{
			name: "members being deleted do not count as live",
			in: Input{Replicas: 2, MaxSurge: 1, Members: concat(
				members("ok", "", 1, nil), members("gone", "", 1, func(m *Member) { m.Deleting = true }))},
			wantCreate: []string{""},
			wantCounts: [5]int{1, 1, 1, 1, 0},
		},
		{
			name:       "scale to zero deletes everything",
			in:         Input{Replicas: 0, MaxSurge: 1, Members: members("m", "", 2, nil)},
			wantDelete: []Retirement{{"m0", CauseScaleDown}, {"m1", CauseScaleDown}},
			wantCounts: [5]int{2, 2, 2, 2, 0},
		},
		{
			name: "a pool of 6 over two providers of equal weight, each with its zones, is created 3/3 and spread within each",
			in: Input{Replicas: 6, MaxSurge: 1, Providers: []ProviderShare{
				{Name: "gcp-eu", Weight: 1, Zones: []string{"b", "c"}}, {Name: "aws-eu", Weight: 1, Zones: []string{"1a"}}}},
			wantCreate: []string{"aws-eu/1a", "gcp-eu/b", "aws-eu/1a", "gcp-eu/b", "gcp-eu/c", "aws-eu/1a"},
		},
		{
			name: "weights 2:1 give 4 and 2 of 6; a provider without zones is one slot",
			in: Input{Replicas: 6, MaxSurge: 1, Providers: []ProviderShare{
				{Name: "gcp-eu", Weight: 2, Zones: []string{"b", "c"}}, {Name: "aws-eu", Weight: 1}}},
			wantCreate: []string{"gcp-eu/b", "gcp-eu/c", "aws-eu/", "gcp-eu/b", "gcp-eu/c", "aws-eu/"},
		},
		{
			name: "a drained provider (weight 0) gives its members to the others, its successors first",
			in: Input{Replicas: 4, MaxSurge: 1, Providers: []ProviderShare{{Name: "gcp-eu", Weight: 1}, {Name: "aws-eu", Weight: 0}},
				Members: concat(members("g", SlotOf("gcp-eu", ""), 2, nil), members("w", SlotOf("aws-eu", ""), 2, nil))},
			wantCreate: []string{"gcp-eu/"},
			wantCounts: [5]int{4, 4, 4, 4, 2},
		},
		{
			name: "a provider removed from the list: its members are replaced on the others",
			in: Input{Replicas: 2, MaxSurge: 1, Providers: []ProviderShare{{Name: "gcp-eu", Weight: 1}},
				Members: concat(members("g", SlotOf("gcp-eu", ""), 1, nil), members("w", SlotOf("aws-eu", ""), 1, nil))},
			wantCreate: []string{"gcp-eu/"},
			wantCounts: [5]int{2, 2, 2, 2, 1},
		},
		{
			name: "a pool across providers at its shares is settled",
			in: Input{Replicas: 3, MaxSurge: 1, Providers: []ProviderShare{{Name: "gcp-eu", Weight: 2}, {Name: "aws-eu", Weight: 1}},
				Members: concat(members("g", SlotOf("gcp-eu", ""), 2, nil), members("w", SlotOf("aws-eu", ""), 1, nil))},
			wantCounts: [5]int{3, 3, 3, 3, 0},
			settled:    true,
		},
		{
			name: "a member refused for room in zone b is replaced in another zone; b keeps the members it has",
			in: Input{Replicas: 6, Zones: zones, MaxSurge: 1, Full: []string{"b"},
				Members: concat(members("a", "a", 2, nil), members("b", "b", 1, nil), members("x", "b", 1, func(m *Member) { m.Ready, m.NoRoom = false, true }),
					members("c", "c", 2, nil))},
			wantCreate: []string{"a"},
			wantCounts: [5]int{6, 5, 5, 6, 1},
		},
		{
			name: "once its successor is available, the refused member goes",
			in: Input{Replicas: 6, Zones: zones, MaxSurge: 1, Full: []string{"b"},
				Members: concat(members("a", "a", 3, nil), members("b", "b", 1, nil), members("x", "b", 1, func(m *Member) { m.Ready, m.NoRoom = false, true }),
					members("c", "c", 2, nil))},
			wantDelete: []Retirement{{"x0", CauseNoRoom}},
			wantCounts: [5]int{7, 6, 6, 7, 1},
		},
		{
			name: "a full provider's share goes to its other zones first, then to the other providers",
			in: Input{Replicas: 6, MaxSurge: 6, Full: []string{"gcp-eu/b"}, Providers: []ProviderShare{
				{Name: "gcp-eu", Weight: 1, Zones: []string{"b", "c"}}, {Name: "aws-eu", Weight: 1, Zones: []string{"1a"}}}},
			wantCreate: []string{"gcp-eu/c", "aws-eu/1a", "gcp-eu/c", "aws-eu/1a", "gcp-eu/c", "aws-eu/1a"},
		},
		{
			name: "every zone of a provider full: its share goes to the other provider",
			in: Input{Replicas: 4, MaxSurge: 4, Full: []string{"gcp-eu/b"}, Providers: []ProviderShare{
				{Name: "gcp-eu", Weight: 1, Zones: []string{"b"}}, {Name: "aws-eu", Weight: 1, Zones: []string{"1a"}}}},
			wantCreate: []string{"aws-eu/1a", "aws-eu/1a", "aws-eu/1a", "aws-eu/1a"},
		},
		{
			name:       "everything full: nothing is created, and nobody is moved",
			in:         Input{Replicas: 3, Zones: []string{"a"}, MaxSurge: 1, Full: []string{"a"}, Members: members("a", "a", 2, nil)},
			wantCounts: [5]int{2, 2, 2, 2, 0},
		},
		{
			name:       "a settled pool does nothing",
			in:         Input{Replicas: 6, Zones: zones, MaxSurge: 1, Members: concat(members("a", "a", 2, nil), members("b", "b", 2, nil), members("c", "c", 2, nil))},
			wantCounts: [5]int{6, 6, 6, 6, 0},
			settled:    true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = t0
			d := decide(tc.in)
			assert.Equal(t, tc.wantCreate, d.Create, "created zones")
			assert.Equal(t, tc.wantDelete, d.Delete, "deleted members")
			assert.Equal(t, tc.wantCounts, [5]int{d.Replicas, d.Ready, d.Available, d.Updated, d.Recycling}, "replicas, ready, available, updated, recycling")
			assert.Equal(t, tc.settled, d.Settled, "settled")
		})
	}
}

// TestDecideRecheck: the clock alone changes a decision when a member's
// minReadySeconds or maxAge runs out, and decide says when.
func TestDecideRecheck(t *testing.T) {
	in := Input{Replicas: 2, MaxSurge: 1, MinReady: 30 * time.Second, MaxAge: 2 * time.Hour, Now: t0, Members: []Member{
		serving("old", ""), // expires in an hour
		{Name: "new", Updated: true, Created: t0.Add(-time.Minute), Ready: true, ReadySince: t0.Add(-10 * time.Second)},
	}}
	assert.Equal(t, 20*time.Second, decide(in).Recheck, "the new member becomes available first")
	in.MinReady = 0
	assert.Equal(t, time.Hour, decide(in).Recheck, "then the old member expires")
}

// TestRollingRecycleKeepsTheFloor plays decide against a simulated pool:
// every member expires at once, successors boot for two passes, and at no
// pass may the available members fall below the floor; in the end every
// member is new and the pool is settled.
func TestRollingRecycleKeepsTheFloor(t *testing.T) {
	for _, budget := range []struct{ surge, unavailable int }{{1, 0}, {2, 0}, {0, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("maxSurge %d maxUnavailable %d", budget.surge, budget.unavailable), func(t *testing.T) {
			zones := []string{"a", "b", "c"}
			in := Input{Replicas: 6, Zones: zones, MaxSurge: budget.surge, MaxUnavailable: budget.unavailable, MaxAge: time.Hour}
			now := t0
			var pool []Member
			for i := range 6 {
				m := serving(fmt.Sprintf("gen0-%d", i), zones[i%3])
				m.Created = now.Add(-2 * time.Hour) // all expired
				pool = append(pool, m)
			}
			serial := 0
			settled := false
			for pass := 0; pass < 200 && !settled; pass++ {
				now = now.Add(time.Second)
				// Successors become Ready two passes after creation.
				for i := range pool {
					if !pool[i].Ready && now.Sub(pool[i].Created) >= 2*time.Second {
						pool[i].Ready, pool[i].ReadySince = true, now
					}
				}
				in.Members, in.Now = pool, now
				d := decide(in)
				if d.Available < 6-budget.unavailable {
					t.Fatalf("pass %d: %d available, below the floor of %d", pass, d.Available, 6-budget.unavailable)
				}
				if d.Replicas > 6+budget.surge {
					t.Fatalf("pass %d: %d members, above replicas + maxSurge", pass, d.Replicas)
				}
				settled = d.Settled
				gone := map[string]bool{}
				for _, r := range d.Delete {
					gone[r.Name] = true
				}
				var next []Member
				for _, m := range pool {
					if !gone[m.Name] {
						next = append(next, m)
					}
				}
				for _, z := range d.Create {
					serial++
					next = append(next, Member{Name: fmt.Sprintf("gen1-%d", serial), Zone: z, Updated: true, Created: now})
				}
				pool = next
			}
			if !settled {
				t.Fatal("the pool never settled")
			}
			perZone := map[string]int{}
			for _, m := range pool {
				assert.Contains(t, m.Name, "gen1-", "every member was recycled")
				perZone[m.Zone]++
			}
			assert.Equal(t, map[string]int{"a": 2, "b": 2, "c": 2}, perZone, "spread kept")
		})
	}
}
