package gateway

import (
	"context"
	"time"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/tenant"
)

// Upstreams is the gateway's way to proxies: who a client is (the
// discovery API's Authorize) and the broker's tunnel path
// (discovery.Tunnels joins the two).
type Upstreams interface {
	Authorize(ctx context.Context, password string) (*tenant.Tenant, error)
	// Tunnel leases a tunnel's upstream (broker.Broker.Tunnel).
	Tunnel(ctx context.Context, req broker.TunnelRequest) (broker.Upstream, error)
	// RenewTunnel extends a tunnel's lease; ReleaseTunnel ends it with the
	// bytes it carried (both are recorded in the ledger, with the session).
	RenewTunnel(ctx context.Context, leaseID, session string, ttl time.Duration, recorded time.Time) (time.Time, error)
	ReleaseTunnel(ctx context.Context, leaseID, session string, carried broker.Carried)
	// Turn takes the slot of a request inside a tunnel through proxy to a
	// paced host (broker.Broker.Turn): how long to hold it.
	Turn(ctx context.Context, proxy, host string, maxWait time.Duration) (time.Duration, error)
	// PushBack reports a site's 429 or 503 on a plain-HTTP request, with
	// its Retry-After, so the host's learned pace slows.
	PushBack(ctx context.Context, host string, retryAfter time.Duration)
	// Refused records that host refused proxy a request of who's (the
	// outcome memory): the site's own 403 or block page blocks it, its 429
	// (limited) pushes back, and its Retry-After cools the proxy for the
	// host. A proxy's own refusal (a CONNECT answered other than 200, an
	// answer Squid marks X-Squid-Error) never comes here: it says nothing
	// of the site.
	Refused(ctx context.Context, who *tenant.Tenant, proxy, host string, limited bool, retryAfter time.Duration)
	// MarkSession scores the session's stint on proxy by the result of an
	// answer the gateway saw (broker.ScoreOf); session "" does nothing.
	MarkSession(ctx context.Context, session, proxy, result string)
	// Admit checks a tenant's tunnels-per-second and bytes-per-day quota
	// before a tunnel or request (a *broker.QuotaError when over).
	Admit(ctx context.Context, who *tenant.Tenant) error
	// MetersBytes says whether who has a bytes-per-day quota; CountBytes
	// adds bytes to who's day and says whether the day's are spent.
	MetersBytes(who *tenant.Tenant) bool
	CountBytes(ctx context.Context, who *tenant.Tenant, n int64) (spent bool)
	// SawClient tells that a tunnel of who's to host on session (its key;
	// "" rotating) came from the TLS client whose JA4 fingerprint is
	// client: the session's reports are about that client, and its next
	// tunnel's Upstream.BannedClient says when the host bans it.
	SawClient(who *tenant.Tenant, session, host, client string)
}
