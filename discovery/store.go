package discovery

import (
	"context"
	"errors"
	"fmt"
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
}

// Report results a client may send.
const (
	ResultOK          = "ok"
	ResultError       = "error"
	ResultRateLimited = "rate_limited"
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
}

// NoProxyAvailableError is Acquire's answer when every candidate is cooling
// down for the target, or there is none.
type NoProxyAvailableError struct {
	// RetryAfter is how long until the first candidate's cooldown for the
	// target ends, on the store's clock; zero when no candidate is cooling
	// (there is no candidate at all).
	RetryAfter time.Duration
}

func (e *NoProxyAvailableError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("no proxy available: the first cooldown ends in %s", e.RetryAfter)
	}
	return "no proxy available"
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
	// Target is the normalized host the client will crawl ("" for none):
	// proxies cooling down for it are skipped.
	Target string
	TTL    time.Duration
}

// Store keeps leases, cooldowns and refused lease requests: the discovery
// API's only mutable state. Every replica that serves discovery on a shared
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
	// Report records a live lease's outcome; rate_limited puts its proxy in
	// cooldown for target until now+cooldown (a longer cooldown already
	// running is kept). ErrLeaseNotFound when the lease is not live.
	Report(ctx context.Context, id, result, target string, cooldown time.Duration) error
	// ActiveLeases counts the live leases of each proxy of ids, in order.
	ActiveLeases(ctx context.Context, ids []string) ([]int, error)
	// NoteRefused records that a lease request selecting pool was refused
	// for want of a proxy; LastRefused reads when that last happened (zero:
	// not since the store began). Pools size themselves by it.
	NoteRefused(ctx context.Context, pool string) error
	LastRefused(ctx context.Context, pool string) (time.Time, error)
	// Route reads a gateway session's route for host (the zero Route when
	// the session is unknown).
	Route(ctx context.Context, session, host string) (Route, error)
	// SetRoute records that a session's tunnel to host went through proxy:
	// as the session's own proxy (own true, which also ends host's detour)
	// or as host's detour. The session is forgotten once idle for longer
	// than idle.
	SetRoute(ctx context.Context, session, host, proxy string, own bool, idle time.Duration) error
	// ReportSession records the outcome of a session's requests to target:
	// rate_limited puts the proxy they went through (target's detour, else
	// the session's own) in cooldown for target, as Report does. A
	// rate_limited report within window of the last one for the session and
	// target is the same burst of refusals (requests already sent when the
	// first report came): it cools nothing more, and returns the proxy the
	// first one did. It returns that proxy, or ErrSessionNotFound.
	ReportSession(ctx context.Context, session, result, target string, cooldown, window time.Duration) (string, error)
	// Ping says whether the store answers, for /readyz.
	Ping(ctx context.Context) error
}
