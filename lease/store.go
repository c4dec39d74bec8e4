package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Lease is one client's claim on one proxy until ExpiresAt.
type Lease struct {
	ID        string
	ProxyID   string
	Target    string
	CreatedAt time.Time
	ExpiresAt time.Time
	// ProxyLeases is the proxy's live leases, this one included, when the
	// store answered: what the API shows as the proxy's activeLeases.
	ProxyLeases int
	// Wait is how long after CreatedAt the lease's first request to its
	// target may go: the slot its pace reserved (zero: at once).
	Wait time.Duration
	// Paced says whether a pace or concurrency limit applied to the lease.
	Paced bool
	// Holder is who took the lease (AcquireRequest.Holder): only they may
	// renew, release or report on it.
	Holder string
	// Why says how Acquire chose the proxy (WhyLeastLoaded,
	// WhyBetterRecord, WhySoonestSlot); empty on a lease read back.
	Why string
	// Exclusive says the lease holds its proxy alone: no other lease goes
	// to it until this one is released or expires (but those asked
	// Within it).
	Exclusive bool
}

// Report results a client may send.
const (
	ResultOK          = "ok"
	ResultError       = "error"
	ResultRateLimited = "rate_limited"
	// ResultBlocked: the target refused the proxy itself (a 403, a ban
	// page): it cools the proxy for the target as rate_limited does, but
	// slows nobody's pace, and counts toward the proxy's ban
	// (spec.banRecycling).
	ResultBlocked = "blocked"
)

// Errors of the lease store.
var (
	// ErrNoProxyAvailable: no candidate is free of a cooldown for the target
	// (or there is no candidate). Acquire returns it inside a
	// *NoProxyAvailableError, which says when to try again.
	ErrNoProxyAvailable = errors.New("no proxy available")
	// ErrLeaseNotFound: the lease never existed, was released or expired.
	ErrLeaseNotFound = errors.New("lease not found")
	// ErrStoreUnavailable: the store could not answer in time (Redis down
	// or slow). Nothing is known about the request's effect beyond what the
	// operation documents; the API answers 503 store_unavailable.
	ErrStoreUnavailable = errors.New("lease store unavailable")
	// ErrSessionNotFound: no gateway session of that name has tunnelled
	// lately (it never did, or it was idle past its time).
	ErrSessionNotFound = errors.New("session not found")
)

// Route is where a gateway session's tunnels to one host go.
type Route struct {
	// Own is the session's own proxy: its tunnels go there while it is
	// healthy and not cooling down for their host. "" before the first.
	Own string
	// Detour is the proxy the session's tunnels to the host went through
	// instead, while its own proxy was cooling down for that host. "" when
	// there is none.
	Detour string
	// Since is when the session took Own (its lifetime runs from then), on
	// the store's clock.
	Since time.Time
	// IP is Own's exit IP when the session took it: a strict session
	// keeps it or fails.
	IP string
	// Hold is the exclusive lease holding Own for the session ("": none).
	Hold string
	// Score is the stint's error score (what its requests' refusals
	// added, less what its successes took away; never below 0), and Uses
	// the tunnels it has carried: a session past its limits is retired.
	Score float64
	Uses  int64
}

// RouteSet is what SetRoute records of one tunnel of a session.
type RouteSet struct {
	// Proxy carried the tunnel: as the session's own (Own, which also ends
	// the host's detour), or as the host's detour.
	Proxy string
	Own   bool
	// Fresh starts a new stint on Own even when it is the proxy the
	// session had (its lifetime ran out): Since restarts.
	Fresh bool
	// IP and Hold are recorded with a new stint on Own (Route.IP,
	// Route.Hold).
	IP, Hold string
	// Idle: the session is forgotten once idle for longer.
	Idle time.Duration
}

// SessionReport is a report on a gateway session's requests to Target:
// Result (ResultOK, ResultRateLimited, ResultBlocked), from Reporter (the
// session's tenant, Outcome.Reporter), about the requests of Client (their
// TLS fingerprint, Outcome.Client; "" unknown). A rate_limited or blocked
// one cools the proxy for Cooldown (zero: not at all); one within Window
// of the last is the same burst of refusals.
type SessionReport struct {
	Session, Reporter, Result, Target, Client string
	Cooldown, Window                          time.Duration
	// Score is added to the error score of the session's stint when the
	// report counts (it is not the same burst as the last) and is about
	// the session's own proxy, not a host's detour; the score never goes
	// below 0.
	Score float64
}

// Limit caps the live leases taken under one key (a tenant's leases, or
// its tunnels): with Max of them live, Acquire answers
// *QuotaExceededError.
type Limit struct {
	Key string
	Max int
}

// ErrQuotaExceeded says a tenant is at one of its limits. Acquire and
// Admit return it inside a *QuotaExceededError.
var ErrQuotaExceeded = errors.New("quota exceeded")

// QuotaExceededError says which of a tenant's limits a request met and
// when to come back.
type QuotaExceededError struct {
	// RetryAfter is when the first of the key's leases ends, or when the
	// rate allows the next; zero when the store cannot tell.
	RetryAfter time.Duration
}

func (e *QuotaExceededError) Error() string {
	return fmt.Sprintf("quota exceeded: retry in %s", e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrQuotaExceeded) hold.
func (e *QuotaExceededError) Unwrap() error { return ErrQuotaExceeded }

// NoProxyAvailableError is Acquire's answer when every candidate is cooling
// down for the target, or there is none.
type NoProxyAvailableError struct {
	// RetryAfter is how long until the first candidate may take the
	// target again (its cooldown ends, or its pace allows a request), on
	// the store's clock; zero when none will by itself (there is no
	// candidate, or every one is at its concurrency limit for the target).
	RetryAfter time.Duration
	// Cause says what held the candidates back (the most common among
	// CausePaced, CauseConcurrency, CauseCooling and CauseExclusive), ""
	// when there is no candidate at all.
	Cause string
}

// Causes of a NoProxyAvailableError.
const (
	// CauseCooling: the candidates are cooling down for the target after a
	// rate_limited report.
	CauseCooling = "cooling"
	// CausePaced: the target's pace allows none of them a request within
	// the wait the request accepts.
	CausePaced = "paced"
	// CauseConcurrency: each holds as many leases for the target as its
	// policy allows.
	CauseConcurrency = "concurrency"
	// CauseExclusive: an exclusive lease holds each candidate, or (for an
	// exclusive request) each holds a lease already.
	CauseExclusive = "exclusive"
)

func (e *NoProxyAvailableError) Error() string {
	switch {
	case e.Cause == CausePaced:
		return fmt.Sprintf("no proxy available: the target's pace allows the next request in %s", e.RetryAfter)
	case e.Cause == CauseConcurrency:
		return "no proxy available: every candidate holds as many connections to the target as its policy allows"
	case e.Cause == CauseExclusive:
		return "no proxy available: every candidate is held by an exclusive lease or (for an exclusive one) in use"
	case e.RetryAfter > 0:
		return fmt.Sprintf("no proxy available: the first cooldown ends in %s", e.RetryAfter)
	}
	return "no proxy available"
}

// Paced says whether politeness, not the fleet's health or cooldowns, held
// the request back: the gateway then answers 429.
func (e *NoProxyAvailableError) Paced() bool {
	return e.Cause == CausePaced || e.Cause == CauseConcurrency
}

// Is makes errors.Is(err, ErrNoProxyAvailable) hold.
func (e *NoProxyAvailableError) Is(target error) bool { return target == ErrNoProxyAvailable }

// Candidates are the proxies a lease may go to: the healthy proxies
// matching one selector, as the view saw them at one moment.
type Candidates struct {
	// Key names the selector; Version changes whenever IDs do. A store may
	// keep an index per Key and rebuild it when Version moves; an empty Key
	// asks for no index.
	Key     string
	Version uint64
	// IDs are the proxies' ids, sorted; callers and stores must not
	// modify them.
	IDs []string
}

// AcquireRequest asks for a lease.
type AcquireRequest struct {
	Candidates Candidates
	// Holder names who takes the lease (a tenant; "" for none), kept with
	// it for the lease's life.
	Holder string
	// Limit, when its Key is set, caps the live leases taken under that
	// key: a tenant's share of the fleet.
	Limit Limit
	// Target is the normalized host the client will crawl ("" for none):
	// proxies cooling down for it are skipped.
	Target string
	TTL    time.Duration
	// PaceOf is the declared pace of each candidate for Target (nil, or a
	// zero Pace: none declared).
	PaceOf func(proxy string) Pace
	// Adaptive applies the pace the store learned for Target from its
	// push-backs (PushBack), alone or over a slower declared one.
	Adaptive bool
	// MaxWait is how far ahead a paced request may reserve its slot: a
	// candidate whose next slot is later is not available now.
	MaxWait time.Duration
	// Exclusive asks for a proxy nobody else holds a lease on, and holds
	// it alone for the lease's life: no other lease goes to it meanwhile.
	Exclusive bool
	// Within names the exclusive lease this one shares its proxy with (a
	// gateway session's tunnels through the proxy the session holds): an
	// exclusive hold keeps out every lease but those asked within it.
	Within string
}

// Pace is how one proxy may send requests to one host: a GCRA (a token
// bucket of Burst requests refilled one per Interval) per (proxy, host),
// at most MaxConcurrent leases for the host at once, and, across every
// proxy sharing FleetKey, a bucket of FleetBurst refilled one per
// FleetInterval. Zero fields limit nothing.
type Pace struct {
	Interval      time.Duration
	Burst         int
	MaxConcurrent int
	// Bucket, when set, keys the per-IP bucket in place of the proxy:
	// every proxy whose pace names the same Bucket (their exit IPs' /24
	// or /64) shares one, as a site that counts by network sees them.
	Bucket string
	// FleetKey names the policy whose fleet-wide cap this is (its
	// namespace/name); FleetInterval zero: no cap.
	FleetKey      string
	FleetInterval time.Duration
	FleetBurst    int
}

// WindowPace is the pace that never lets more than n requests fall in any
// window of interval, as a site's sliding or fixed window counts them:
// one request per (interval + jitter)/n, no burst. jitter is the spread
// of the way from the store's slot to the site (WindowJitter), absorbed so
// that n+1 requests never arrive within one interval. A token bucket of n
// (a burst of n, then n per interval) would let 2n fall in one window.
func WindowPace(n int, interval time.Duration) (spacing time.Duration) {
	n = max(n, 1)
	return (interval + WindowJitter(interval)) / time.Duration(n)
}

// WindowJitter is the allowance WindowPace keeps for the way's jitter: 5%
// of the interval, at most 100ms (the cost: at most 5% of the rate).
func WindowJitter(interval time.Duration) time.Duration {
	return min(interval/20, 100*time.Millisecond)
}

// BucketOf is the key of proxy's bucket under p: its Bucket, or itself.
func (p Pace) BucketOf(proxy string) string {
	if p.Bucket != "" {
		return p.Bucket
	}
	return proxy
}

// IsZero says whether p limits nothing.
func (p Pace) IsZero() bool {
	return p.Interval <= 0 && p.MaxConcurrent <= 0 && p.FleetInterval <= 0
}

// Learned is the per-proxy pace a store learned for a host from its
// push-backs: requests Interval apart, as of the store's now. It halves
// every LearnedHalfLife without a push-back, and is gone once under
// MinLearnedInterval.
type Learned struct {
	Interval time.Duration
	// Since is the last push-back that set it.
	Since time.Time
	// PushBacks counts the push-backs that moved it since it was set.
	PushBacks int
}

// The adaptive pace: AIMD as TCP does, seeded by Retry-After. A push-back
// (429 or 503) doubles the host's per-proxy interval, or sets it to the
// site's Retry-After if that is longer (capped at MaxLearnedInterval);
// push-backs within one interval of the last are the same burst and only
// raise it to their Retry-After. Without push-backs the interval halves
// every LearnedHalfLife, so the fleet speeds up slowly.
const (
	LearnedHalfLife    = 30 * time.Second
	MinLearnedInterval = 10 * time.Millisecond
	MaxLearnedInterval = time.Minute
	// FirstLearnedInterval is a first push-back's interval when it says
	// no Retry-After.
	FirstLearnedInterval = 250 * time.Millisecond
)

// LearnedAt is the learned interval i set at since, as of now (zero once
// under MinLearnedInterval): both stores compute it so.
func LearnedAt(i time.Duration, since, now time.Time) time.Duration {
	if i <= 0 {
		return 0
	}
	el := now.Sub(since)
	if el < 0 {
		el = 0
	}
	eff := time.Duration(float64(i) * math.Exp2(-el.Seconds()/LearnedHalfLife.Seconds()))
	if eff < MinLearnedInterval {
		return 0
	}
	return eff
}

// PushedBack is a host's learned interval after a push-back at now with
// retryAfter (zero: none said), from cur (its interval as of now) set at
// since.
func PushedBack(cur time.Duration, since, now time.Time, retryAfter time.Duration) time.Duration {
	retryAfter = min(retryAfter, MaxLearnedInterval)
	if cur > 0 && now.Sub(since) < cur {
		return max(cur, retryAfter) // the same burst of refusals
	}
	next := max(2*cur, retryAfter)
	if next <= 0 {
		next = FirstLearnedInterval
	}
	return min(max(next, MinLearnedInterval), MaxLearnedInterval)
}

// effectivePace is a candidate's pace for a request: the declared one,
// slowed to the learned interval where that is longer (a learned pace
// alone sends one request at a time per interval).
func effectivePace(declared Pace, learned time.Duration) Pace {
	if learned > declared.Interval {
		declared.Interval = learned
		if declared.Burst < 1 {
			declared.Burst = 1
		}
	}
	return declared
}

// DefaultStoreTimeout bounds each store call when its caller sets no
// other bound: far above a healthy Redis round trip, far below a client's
// patience.
const DefaultStoreTimeout = time.Second

// RefusedMemory is how long a store remembers a pool's refused lease
// request: far longer than the autoscaler looks back, and short enough
// that a pool deleted or never created leaves nothing behind.
const RefusedMemory = 10 * time.Minute

// ProbeAskMemory is how long a store keeps a proxy's ask for a probe
// (AskProbe): far longer than the replicas poll for asks, short enough
// that an ask is news when it is read.
const ProbeAskMemory = time.Minute

// Store keeps leases, cooldowns, refused lease requests, asks for probes
// and the outcome memory: the discovery API's only mutable state. Every replica that serves discovery on a shared
// backend sees the same state. Each method is safe for concurrent use,
// bounded by ctx, and reads time from the store's own clock (for Redis, the
// server's TIME), so replicas with skewed clocks agree. Housekeeping
// (expiry) is the backend's own business: a lease or cooldown is gone the
// moment its time is up, whether or not anything swept it.
//
// An error that is none of the sentinels above means the store could not
// answer: callers treat it as ErrStoreUnavailable.
type Store interface {
	// Acquire leases the least-loaded candidate that is not cooling down
	// for the target. A backend documents whether "least-loaded" is exact
	// or sampled. With none available it returns a *NoProxyAvailableError.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Get returns a live lease, or ErrLeaseNotFound.
	Get(ctx context.Context, id string) (Lease, error)
	// Renew extends a live lease to now+ttl, or returns ErrLeaseNotFound.
	Renew(ctx context.Context, id string, ttl time.Duration) (Lease, error)
	// Release ends a lease; releasing an unknown lease is not an error.
	Release(ctx context.Context, id string) error
	// Report records a live lease's outcome, its holder the reporter;
	// rate_limited puts its proxy in cooldown for target until now+cooldown
	// (a longer cooldown already running is kept). ErrLeaseNotFound when
	// the lease is not live.
	Report(ctx context.Context, id, result, target string, cooldown time.Duration) error
	// ActiveLeases counts the live leases of each proxy of ids, in order.
	ActiveLeases(ctx context.Context, ids []string) ([]int, error)
	// Held says, for each proxy of ids in order, whether an exclusive lease
	// holds it.
	Held(ctx context.Context, ids []string) ([]bool, error)
	// NoteRefused records that a lease request selecting pool (its
	// namespace/name) was refused for want of a proxy; LastRefused reads
	// when that last happened (zero: not within RefusedMemory). Pools size
	// themselves by it.
	NoteRefused(ctx context.Context, pool string) error
	LastRefused(ctx context.Context, pool string) (time.Time, error)
	// AskProbe records that a tunnel could not reach proxy (its
	// namespace/name), so that the replica which probes it, maybe another
	// one, probes it soon; ProbesAsked reads the proxies asked for after
	// the cursor after (0: within ProbeAskMemory) and the cursor for the
	// next read. A proxy asked for again moves to its latest ask; a read
	// may repeat an ask the one before returned, never miss one.
	AskProbe(ctx context.Context, proxy string) error
	ProbesAsked(ctx context.Context, after int64) (proxies []string, next int64, err error)
	// Route reads a gateway session's route for host (the zero Route when
	// the session is unknown).
	Route(ctx context.Context, session, host string) (Route, error)
	// SetRoute records that a session's tunnel to host went through
	// set.Proxy (RouteSet). A new stint on the session's own proxy (another
	// proxy, or Fresh) records Since, IP and Hold anew and starts its Score
	// and Uses from 0; the same proxy keeps them. Every tunnel through the
	// own proxy counts one use.
	SetRoute(ctx context.Context, session, host string, set RouteSet) error
	// ReportSession records the outcome of a session's requests to target
	// (SessionReport):
	// rate_limited puts the proxy they went through (target's detour, else
	// the session's own) in cooldown for target, as Report does. A
	// rate_limited report within window of the last one for the session and
	// target is the same burst of refusals (requests already sent when the
	// first report came): it cools nothing more, and returns the proxy the
	// first one did. reporter is the session's tenant (Outcome.Reporter).
	// It returns that proxy, or ErrSessionNotFound.
	ReportSession(ctx context.Context, r SessionReport) (string, error)
	// MarkSession adds delta to the error score of session's stint when
	// proxy is the session's own (a detour's answers are not the stint's),
	// never below 0, and returns the score; ErrSessionNotFound for a
	// session that has not tunnelled lately.
	MarkSession(ctx context.Context, session, proxy string, delta float64) (float64, error)
	// Slot reserves proxy's next request slot for target under p (its
	// pace per (proxy, host) and the fleet's, slowed to target's learned
	// pace when adaptive) when it comes within maxWait, and says how long
	// to wait for it; a later one is a *NoProxyAvailableError (CausePaced)
	// and reserves nothing. It takes no lease: it paces a request inside a
	// tunnel that holds one, on the same slots Acquire reserves.
	Slot(ctx context.Context, proxy, target string, p Pace, adaptive bool, maxWait time.Duration) (time.Duration, error)
	// PushBack records that host pushed back (a 429 or 503, with the
	// Retry-After it said, zero for none): its learned pace slows
	// (PushedBack). It returns the pace as it now is.
	PushBack(ctx context.Context, host string, retryAfter time.Duration) (Learned, error)
	// LearnedPace reads host's learned pace (the zero Learned: none).
	LearnedPace(ctx context.Context, host string) (Learned, error)
	// Admit takes one from key's rate (a GCRA of interval and burst) when
	// it allows one now; otherwise it takes nothing and returns a
	// *QuotaExceededError saying when it will.
	Admit(ctx context.Context, key string, interval time.Duration, burst int) error
	// AddUsage adds n to key's count, which ends ttl after its first use,
	// and returns the count (n 0 only reads it).
	AddUsage(ctx context.Context, key string, n int64, ttl time.Duration) (int64, error)
	// CountUsage adds c to row k's counters; the row's day is kept for
	// retention after it ends. A tenant's day keeps at most MaxUsageHosts
	// hosts apart: the others count under UsageOtherHost.
	CountUsage(ctx context.Context, k UsageKey, c UsageCounts, retention time.Duration) error
	// ReadUsage returns every row of the days fromDay to toDay (as Day
	// names them), both included.
	ReadUsage(ctx context.Context, fromDay, toDay string) (map[UsageKey]UsageCounts, error)
	// AppendLedger keeps a ledger record, stamped At on the store's clock,
	// and forgets those older than retention.
	AppendLedger(ctx context.Context, e LedgerEntry, retention time.Duration) error
	// ReadLedger returns the records stamped from from to to, in order.
	ReadLedger(ctx context.Context, from, to time.Time) ([]LedgerEntry, error)
	// Ping says whether the store answers, for /readyz.
	Ping(ctx context.Context) error
	OutcomeMemory
}
