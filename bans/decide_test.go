package bans

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

var now = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// subject is a proxy of group banned at 3 hosts within 10m.
func subject(name, group string) Subject {
	return Subject{Key: types.NamespacedName{Namespace: "crawl", Name: name}, Group: group, Hosts: 3, Window: 10 * time.Minute,
		Since: now.Add(-time.Hour)}
}

// blocked are blocks of name by hosts, ago, reported by the platform.
func blocked(name string, ago time.Duration, hosts ...string) []lease.Block {
	return blockedBy(name, ago, []string{tenant.PlatformName}, hosts...)
}

// blockedBy are blocks of name by hosts, ago, each reported by every one
// of who (a second apart, the first latest).
func blockedBy(name string, ago time.Duration, who []string, hosts ...string) []lease.Block {
	var out []lease.Block
	for _, h := range hosts {
		b := lease.Block{Proxy: "crawl/" + name, Host: h, At: now.Add(-ago), By: lease.OutcomeReport}
		for i, w := range who {
			b.Voices = append(b.Voices, lease.Voice{Who: w, At: now.Add(-ago - time.Duration(i)*time.Second)})
		}
		out = append(out, b)
	}
	return out
}

const (
	teamA = "system:serviceaccount:crawl-a:crawler"
	teamB = "system:serviceaccount:crawl-b:crawler"
)

func concat(lists ...[]lease.Block) []lease.Block {
	var out []lease.Block
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func TestDecide(t *testing.T) {
	fleet := func(n int) []Subject {
		var s []Subject
		for i := range n {
			s = append(s, subject(string(rune('a'+i)), "crawl/eu"))
		}
		return s
	}
	cases := []struct {
		name        string
		subjects    []Subject
		blocks      []lease.Block
		wantBanned  []string
		wantSuspect []string
		pardon      map[string]time.Time
	}{
		{name: "blocked by 3 distinct hosts within the window: banned", subjects: fleet(10),
			blocks: blocked("a", time.Minute, "x.example", "y.example", "z.example"), wantBanned: []string{"a"}},
		{name: "by 2: not yet", subjects: fleet(10), blocks: blocked("a", time.Minute, "x.example", "y.example")},
		{name: "one outside the window does not count", subjects: fleet(10),
			blocks: concat(blocked("a", time.Minute, "x.example", "y.example"), blocked("a", 11*time.Minute, "z.example"))},
		{name: "blocks before the instance served were its predecessor's", subjects: func() []Subject {
			s := fleet(10)
			s[0].Since = now.Add(-30 * time.Second)
			return s
		}(), blocks: blocked("a", time.Minute, "x.example", "y.example", "z.example")},
		{name: "policy off (hosts 0): never banned", subjects: func() []Subject {
			s := fleet(10)
			s[0].Hosts = 0
			return s
		}(), blocks: blocked("a", time.Minute, "x.example", "y.example", "z.example")},
		{name: "a host blocking most of the pool is suspect: nobody banned for it", subjects: fleet(4),
			blocks: concat(blocked("a", time.Minute, "down.example", "y.example", "z.example"), blocked("b", time.Minute, "down.example"),
				blocked("c", time.Minute, "down.example"), blocked("d", time.Minute, "down.example")),
			wantSuspect: []string{"crawl/eu down.example"}},
		{name: "the guard is per group: another pool's blocks say nothing of this one", subjects: append(fleet(10),
			subject("p", "crawl/us"), subject("q", "crawl/us"), subject("r", "crawl/us")),
			blocks: concat(blocked("a", time.Minute, "x.example", "y.example", "z.example"),
				blocked("p", time.Minute, "x.example"), blocked("q", time.Minute, "x.example"), blocked("r", time.Minute, "x.example")),
			wantBanned: []string{"a"}, wantSuspect: []string{"crawl/us x.example"}},
		{name: "two blocked of a small pool are no outage", subjects: fleet(3),
			blocks:     concat(blocked("a", time.Minute, "x.example", "y.example", "z.example"), blocked("b", time.Minute, "x.example")),
			wantBanned: []string{"a"}},
		{name: "a host suspect at an earlier pass: its blocks from then on are pardoned, a later one counts", subjects: fleet(10),
			blocks: concat(blocked("a", 3*time.Minute, "down.example"), blocked("a", time.Minute, "y.example", "z.example")),
			pardon: map[string]time.Time{SuspectKey("crawl/eu", "down.example"): now.Add(-2 * time.Minute)}},
		{name: "after the pardon", subjects: fleet(10),
			blocks: concat(blocked("a", time.Minute, "down.example", "y.example", "z.example")),
			pardon: map[string]time.Time{SuspectKey("crawl/eu", "down.example"): now.Add(-2 * time.Minute)}, wantBanned: []string{"a"}},
		{name: "blocks of unknown proxies are ignored", subjects: fleet(3), blocks: blocked("gone", time.Minute, "x.example", "y.example", "z.example")},
		{name: "one tenant's word alone bans nothing, however many hosts it names", subjects: fleet(10),
			blocks: blockedBy("a", time.Minute, []string{teamA}, "x1.example", "x2.example", "x3.example", "x4.example")},
		{name: "nor makes a host suspect", subjects: fleet(4),
			blocks: concat(blockedBy("a", time.Minute, []string{teamA}, "down.example"), blockedBy("b", time.Minute, []string{teamA}, "down.example"),
				blockedBy("c", time.Minute, []string{teamA}, "down.example"), blockedBy("d", time.Minute, []string{teamA}, "down.example"))},
		{name: "two tenants agreeing on each host ban", subjects: fleet(10),
			blocks: blockedBy("a", time.Minute, []string{teamA, teamB}, "x.example", "y.example", "z.example"), wantBanned: []string{"a"}},
		{name: "a tenant and a canary ban", subjects: fleet(10),
			blocks: blockedBy("a", time.Minute, []string{teamA, ""}, "x.example", "y.example", "z.example"), wantBanned: []string{"a"}},
		{name: "the second tenant's word from before the window does not count", subjects: fleet(10),
			blocks: concat(blockedBy("a", time.Minute, []string{teamA, teamB}, "x.example", "y.example"),
				[]lease.Block{{Proxy: "crawl/a", Host: "z.example", At: now.Add(-time.Minute), By: lease.OutcomeReport,
					Voices: []lease.Voice{{Who: teamA, At: now.Add(-time.Minute)}, {Who: teamB, At: now.Add(-11 * time.Minute)}}}})},
		{name: "a record from before voices counts when a canary saw it", subjects: fleet(10),
			blocks: []lease.Block{
				{Proxy: "crawl/a", Host: "x.example", At: now.Add(-time.Minute), By: lease.OutcomeCanary},
				{Proxy: "crawl/a", Host: "y.example", At: now.Add(-time.Minute), By: lease.OutcomeCanary},
				{Proxy: "crawl/a", Host: "z.example", At: now.Add(-time.Minute), By: lease.OutcomeCanary},
				{Proxy: "crawl/b", Host: "x.example", At: now.Add(-time.Minute), By: lease.OutcomeReport},
				{Proxy: "crawl/b", Host: "y.example", At: now.Add(-time.Minute), By: lease.OutcomeReport},
				{Proxy: "crawl/b", Host: "z.example", At: now.Add(-time.Minute), By: lease.OutcomeGateway},
			}, wantBanned: []string{"a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			verdicts, suspects, _ := Decide(c.subjects, c.blocks, now, DefaultMaxBlockedShare, c.pardon)
			var banned []string
			for key, v := range verdicts {
				if v.Banned {
					banned = append(banned, key.Name)
					assert.GreaterOrEqual(t, len(v.Hosts), 3)
				}
			}
			assert.ElementsMatch(t, c.wantBanned, banned)
			var got []string
			for _, s := range suspects {
				got = append(got, s.Group+" "+s.Host)
			}
			assert.ElementsMatch(t, c.wantSuspect, got)
		})
	}
}

// clientBlocks are blocks of name by hosts a minute ago, reported by the
// platform about client, with passes of other clients.
func clientBlocks(name, client string, passes []lease.Pass, hosts ...string) []lease.Block {
	out := blocked(name, time.Minute, hosts...)
	for i := range out {
		out[i].Voices[0].Client = client
		out[i].Passes = passes
	}
	return out
}

func TestDecideClientBans(t *testing.T) {
	const banned, other = "t13d1516h2_aaaaaaaaaaaa_bbbbbbbbbbbb", "t13d1311h2_cccccccccccc_dddddddddddd"
	fleet := make([]Subject, 0, 10)
	for i := range 10 {
		fleet = append(fleet, subject(string(rune('a'+i)), "crawl/eu"))
	}
	canary := []lease.Pass{{Client: lease.ClientCanary, At: now.Add(-30 * time.Second)}}
	cases := []struct {
		name       string
		blocks     []lease.Block
		wantBanned []string
		wantClient []string
		wantSusp   int
	}{
		{name: "three hosts block one client through four proxies while the canary passes: a client ban each, nobody banned",
			blocks: concat(clientBlocks("a", banned, canary, "x.example", "y.example", "z.example"), clientBlocks("b", banned, canary, "x.example", "y.example", "z.example"),
				clientBlocks("c", banned, canary, "x.example", "y.example", "z.example"), clientBlocks("d", banned, nil, "x.example", "y.example", "z.example")),
			wantClient: []string{"x.example " + banned, "y.example " + banned, "z.example " + banned}},
		{name: "no other client passed: blocks of one client are blocks of the proxies",
			blocks:     concat(clientBlocks("a", banned, nil, "x.example", "y.example", "z.example")),
			wantBanned: []string{"a"}},
		{name: "another client passed on too few proxies",
			blocks: concat(clientBlocks("a", banned, canary, "x.example", "y.example", "z.example"), clientBlocks("b", banned, nil, "x.example"),
				clientBlocks("c", banned, nil, "x.example")),
			wantBanned: []string{"a"}},
		{name: "one tenant's claimed successes pardon no other's client",
			blocks: concat(clientBlocks("a", banned, []lease.Pass{{Client: other, Who: teamA, At: now}}, "x.example", "y.example", "z.example"),
				clientBlocks("b", banned, []lease.Pass{{Client: other, Who: teamA, At: now}}, "x.example"),
				clientBlocks("c", banned, []lease.Pass{{Client: other, Who: teamA, At: now}}, "x.example")),
			wantBanned: []string{"a"}, wantSusp: 0},
		{name: "two tenants' successes do",
			blocks: concat(clientBlocks("a", banned, []lease.Pass{{Client: other, Who: teamA, At: now}, {Client: "third", Who: teamB, At: now}}, "x.example"),
				clientBlocks("b", banned, []lease.Pass{{Client: other, Who: teamA, At: now}, {Client: "third", Who: teamB, At: now}}, "x.example"),
				clientBlocks("c", banned, nil, "x.example")),
			wantClient: []string{"x.example " + banned}},
		{name: "a pass of the blocked client itself is none",
			blocks: concat(clientBlocks("a", banned, []lease.Pass{{Client: banned, At: now}}, "x.example", "y.example", "z.example"),
				clientBlocks("b", banned, []lease.Pass{{Client: banned, At: now}}, "x.example"), clientBlocks("c", banned, nil, "x.example")),
			wantBanned: []string{"a"}},
		{name: "a block that names two clients, or an unknown one, is the proxy's",
			blocks: concat(clientBlocks("b", banned, canary, "x.example"), clientBlocks("c", banned, canary, "x.example"), clientBlocks("d", banned, canary, "x.example"),
				func() []lease.Block {
					b := clientBlocks("a", banned, canary, "x.example")
					b[0].Voices = append(b[0].Voices, lease.Voice{Who: teamA, Client: other, At: now.Add(-time.Minute)})
					return b
				}(), clientBlocks("a", "", canary, "y.example", "z.example")),
			wantClient: []string{"x.example " + banned}, wantBanned: []string{"a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			verdicts, suspects, clientBans := Decide(slices.Clone(fleet), c.blocks, now, DefaultMaxBlockedShare, nil)
			var gotBanned []string
			for key, v := range verdicts {
				if v.Banned {
					gotBanned = append(gotBanned, key.Name)
				}
			}
			assert.ElementsMatch(t, c.wantBanned, gotBanned)
			var got []string
			for _, cb := range clientBans {
				got = append(got, cb.Host+" "+cb.Client)
				assert.Equal(t, "crawl/eu", cb.Group)
				assert.GreaterOrEqual(t, cb.Blocked, MinSuspectBlocked)
			}
			assert.ElementsMatch(t, c.wantClient, got)
			assert.Len(t, suspects, c.wantSusp, "a client's ban makes no host suspect: %v", suspects)
		})
	}
}
