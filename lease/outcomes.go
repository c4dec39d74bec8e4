package lease

import (
	"context"
	"math"
	"time"
)

// Outcome is what one request, canary probe or tunnel through a proxy to a
// host came to: served, or refused: blocked (a 403, a ban page, a refused
// tunnel, a failing canary), or pushed back (Limited: a 429). Errors that
// say nothing of the host's view of the proxy (a timeout, a reset) are no
// outcome.
type Outcome struct {
	Blocked bool
	// Limited, on a refusal, says it was a push-back (a 429): it weighs
	// against the proxy in selection as a block does, but is no block of
	// the proxy itself, so Blocks (and bans) leave it out; pacing answers
	// it.
	Limited bool
	// Source is what saw it: OutcomeReport, OutcomeCanary or
	// OutcomeGateway.
	Source string
	// Cooldown, on a blocked outcome, also keeps the proxy away from the
	// host that long (a longer cooldown running is kept), as a
	// rate_limited report does; the record's LastBlockedBy says why.
	Cooldown time.Duration
	// Reporter is who the outcome rests on: the tenant whose report, or
	// whose request through the gateway, it came from; "" for the
	// operator's own canary. A block's reporter is kept as a Voice, so
	// the ban judge can tell one tenant's word from a fleet's.
	Reporter string
	// Client is the TLS fingerprint (JA4, package tlsprint) of the client
	// whose request it was, when the gateway saw its ClientHello
	// (ClientCanary for the operator's canaries; "" unknown). A block
	// keeps it in its Voice and a success among the record's Passes, so
	// the ban judge can tell a host that blocks a client everywhere from
	// one that blocks the proxy.
	Client string
}

// ClientCanary is the Client of the operator's canary probes: another
// client than any crawler's.
const ClientCanary = "canary"

// Voice is one reporter's last block of a proxy by a host: the ban judge
// weighs blocks by who saw them (a canary, the platform, or several
// tenants), so that one tenant alone cannot ban a proxy others share.
type Voice struct {
	Who string    `json:"who"`
	At  time.Time `json:"at"`
	// Client is the fingerprint of the client whose request was blocked
	// ("" unknown).
	Client string `json:"client,omitempty"`
}

// Pass is the last success of one client (Outcome.Client) with a host
// through a proxy, and who reported it (Outcome.Reporter).
type Pass struct {
	Client string    `json:"client"`
	At     time.Time `json:"at"`
	Who    string    `json:"who,omitempty"`
}

// MaxVoices bounds the reporters a record keeps: the latest block of each,
// the oldest forgotten first. A few are enough to tell one from many.
const MaxVoices = 4

// withVoice is voices after who blocked client at now: who's entry moves
// to the front, and the oldest beyond MaxVoices go.
func withVoice(voices []Voice, who, client string, now time.Time) []Voice {
	out := make([]Voice, 0, min(len(voices)+1, MaxVoices))
	out = append(out, Voice{Who: who, At: now, Client: client})
	for _, v := range voices {
		if v.Who != who && len(out) < MaxVoices {
			out = append(out, v)
		}
	}
	return out
}

// withPass is passes after client succeeded at now, as who reported: its
// entry moves to the front, and the oldest beyond MaxVoices go.
func withPass(passes []Pass, client, who string, now time.Time) []Pass {
	out := make([]Pass, 0, min(len(passes)+1, MaxVoices))
	out = append(out, Pass{Client: client, At: now, Who: who})
	for _, p := range passes {
		if p.Client != client && len(out) < MaxVoices {
			out = append(out, p)
		}
	}
	return out
}

// Sources of an Outcome.
const (
	// OutcomeReport: a crawler's report on its lease or gateway session.
	OutcomeReport = "report"
	// OutcomeCanary: one of the team's canaries (spec.healthCheck.targets),
	// probed through the proxy by the health engine.
	OutcomeCanary = "canary"
	// OutcomeGateway: a failure the gateway saw itself (a tunnel the
	// upstream refused, a plain-HTTP 429 or 403).
	OutcomeGateway = "gateway"
)

// HostRecord is a proxy's record with one host: its served and blocked
// outcomes, each counted with a weight that halves every OutcomeHalfLife,
// as of the store's now.
type HostRecord struct {
	Host   string  `json:"host"`
	Served float64 `json:"served"`
	// Blocked weighs the refusals: blocks and push-backs.
	Blocked float64 `json:"blocked"`
	// LastBlocked is the last block (not a push-back; zero: none
	// remembered), and LastBlockedBy what saw it.
	LastBlocked   time.Time `json:"lastBlocked,omitzero"`
	LastBlockedBy string    `json:"lastBlockedBy,omitempty"`
	// Voices are the reporters of its blocks, the latest first.
	Voices []Voice `json:"voices,omitempty"`
	// Passes are the known clients it served, the latest first.
	Passes []Pass `json:"passes,omitempty"`
	// At is the last outcome of either kind.
	At time.Time `json:"at"`
}

// Block is one proxy's last blocked outcome with one host, and who
// reported its blocks.
type Block struct {
	Proxy, Host string
	At          time.Time
	By          string
	Voices      []Voice
	// Passes are the clients the host served through the proxy lately
	// (HostRecord.Passes).
	Passes []Pass
}

// ClientBan is a host that blocks one client, by its TLS fingerprint,
// whatever the proxy: a fingerprint ban, for which no proxy is banned.
type ClientBan struct {
	Host, Client string
	Until        time.Time
}

// MaxClientBans bounds the marks a store keeps: past it, the one that ends
// first goes.
const MaxClientBans = 1024

// The outcome memory's bounds: both stores keep them so.
const (
	// OutcomeHalfLife is how fast a record fades: a host that blocked a
	// proxy an hour ago and served it since counts for little.
	OutcomeHalfLife = 10 * time.Minute
	// OutcomeRetention is how long a (proxy, host) record is kept after
	// its last outcome; the ban window (spec.banRecycling.window) cannot
	// look further back.
	OutcomeRetention = time.Hour
	// MaxHostRecords bounds the hosts remembered per proxy: past it, the
	// record with the oldest outcome goes.
	MaxHostRecords = 64
)

// Decayed is a weight w counted at at, as of now.
func Decayed(w float64, at, now time.Time) float64 {
	el := now.Sub(at)
	if el <= 0 || w == 0 {
		return w
	}
	return w * math.Exp2(-el.Seconds()/OutcomeHalfLife.Seconds())
}

// Recorded is r after o at now (r as stored, at r.At).
func (r HostRecord) Recorded(o Outcome, now time.Time) HostRecord {
	r.Served, r.Blocked = Decayed(r.Served, r.At, now), Decayed(r.Blocked, r.At, now)
	switch {
	case o.Blocked && o.Limited:
		r.Blocked++
	case o.Blocked:
		r.Blocked++
		r.LastBlocked, r.LastBlockedBy = now, o.Source
		r.Voices = withVoice(r.Voices, o.Reporter, o.Client, now)
	default:
		r.Served++
		if o.Client != "" {
			r.Passes = withPass(r.Passes, o.Client, o.Reporter, now)
		}
	}
	r.At = now
	return r
}

// AsOf is r's weights as of now.
func (r HostRecord) AsOf(now time.Time) HostRecord {
	r.Served, r.Blocked = Decayed(r.Served, r.At, now), Decayed(r.Blocked, r.At, now)
	return r
}

// minBlockedWeight is a decayed blocked weight that still counts against a
// proxy in selection: a block some seven half-lives old no longer does.
const minBlockedWeight = 0.01

// betterRecord says whether a proxy blocked a (decayed) times by a host is
// to be preferred to one blocked b times, among equals: fewer blocks, by a
// margin that ignores rounding.
func betterRecord(a, b float64) bool {
	if a < minBlockedWeight {
		a = 0
	}
	if b < minBlockedWeight {
		b = 0
	}
	return a < b-1e-9
}

// Why a lease went to its proxy (Lease.Why).
const (
	// WhyLeastLoaded: the candidate with the fewest live leases (then the
	// least recently leased).
	WhyLeastLoaded = "least-loaded"
	// WhyBetterRecord: among the least-loaded, the one the target has
	// blocked least lately.
	WhyBetterRecord = "least-loaded, then the fewest recent blocks by the target"
	// WhySoonestSlot: the candidate whose next slot in the target's pace
	// comes first.
	WhySoonestSlot = "the soonest slot in the target's pace"
)

// OutcomeMemory remembers how hosts answered each proxy and which exit IPs
// were retired for bans: the operator learns from it which proxy to prefer
// for a host, which to recycle, and which IP never to serve again. It is
// part of the lease store so replicas and restarts share it.
type OutcomeMemory interface {
	// RecordOutcome adds o to proxy's record with host.
	RecordOutcome(ctx context.Context, proxy, host string, o Outcome) error
	// Outcomes is proxy's records (as of the store's now), by host.
	Outcomes(ctx context.Context, proxy string) ([]HostRecord, error)
	// Blocks is every (proxy, host) whose last blocked outcome is at or
	// after since (at most OutcomeRetention ago), in no order.
	Blocks(ctx context.Context, since time.Time) ([]Block, error)
	// BurnIP remembers ip as burned in scope (a provider instance) until
	// retention from now.
	BurnIP(ctx context.Context, scope, ip string, retention time.Duration) error
	// BurnedUntil is when ip stops being burned in scope (zero: it is not).
	BurnedUntil(ctx context.Context, scope, ip string) (time.Time, error)
	// EndCooldown ends proxy's cooldown for host when it ends no later
	// than notAfter: the hold a canary put there (and any shorter one it
	// covered), not a longer one a site's Retry-After asked for.
	EndCooldown(ctx context.Context, proxy, host string, notAfter time.Time) error
	// MarkClientBan remembers, for retention from now, that host blocks
	// client (a TLS fingerprint) through every proxy (a ClientBan); a
	// later end already marked is kept.
	MarkClientBan(ctx context.Context, host, client string, retention time.Duration) error
	// ClientBans is every mark not yet ended, in no order.
	ClientBans(ctx context.Context) ([]ClientBan, error)
	// ForgetProxy drops proxy's cooldowns and outcome records: they were
	// about the address it had, and it has moved (a replacement, a new
	// address). Its leases stay.
	ForgetProxy(ctx context.Context, proxy string) error
}
