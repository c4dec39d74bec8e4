// Package broker decides who gets which proxy, when: the one acquire path
// that the discovery API's leases and the gateway's tunnels both take.
// It narrows the fleet to what a tenant may lease (RBAC through tenant),
// holds a tenant to its quotas, applies each site's politeness, keeps
// exclusive holds and gateway sessions (soft, strict, with lifetimes),
// chooses by outcome, records every lease and tunnel in the ledger, tells
// proxies of released leases, and says why a request was refused. The
// state it decides on is in the lease store (package lease) and the view
// of the fleet (View); the API and the gateway are thin callers that map
// its answers to HTTP.
//
// It sits above lease and below discovery and the gateway: it must never
// import either of them, the controllers, the providers or health
// (depguard enforces it), and never call the Kubernetes API per request.
package broker

import (
	"context"
	"time"

	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// Defaults of a lease.
const (
	DefaultTTL      = 300 * time.Second
	DefaultMaxTTL   = time.Hour
	DefaultCooldown = 15 * time.Minute
)

// Options configure a Broker.
type Options struct {
	// DefaultTTL is a lease's when its request names none; MaxTTL bounds
	// any; DefaultCooldown is a rate_limited report's without Retry-After.
	DefaultTTL, MaxTTL, DefaultCooldown time.Duration
	// Store keeps the leases; each call is bounded by StoreTimeout
	// (lease.DefaultStoreTimeout when 0).
	Store        lease.Store
	StoreTimeout time.Duration
	// View is the fleet as the manager's cache has it.
	View *View
	// Clock is the broker's (the real one when nil).
	Clock clock.WithTicker
	// Credentials reads proxies' credentials, to sign a lease's own.
	Credentials CredentialsLookup
	// Politeness are the sites' declared paces; Tenants what RBAC lets a
	// tenant lease; Quotas their TenantQuotas.
	Politeness Politeness
	Tenants    Tenants
	Quotas     Quotas
	// TenantReviewTTL is how long a tenant's narrowed candidates are
	// reused for the same selector (while its candidates are unchanged);
	// 0 narrows every request anew.
	TenantReviewTTL time.Duration
	// Ledger is where lease and tunnel records go besides the store; they
	// are kept LedgerRetention (lease.DefaultLedgerRetention when 0).
	Ledger          lease.LedgerSink
	LedgerRetention time.Duration
	// Prices are each provider instance's prices, for the usage's cost
	// figure (none: no cost); UsageRetention is how long a day's usage is
	// kept after it ends (lease.DefaultUsageRetention when 0).
	Prices         map[string]Price
	UsageRetention time.Duration
	// Resolver tells whether a host has an IPv6 address, which a
	// dual-stack proxy reaches it at (net.DefaultResolver when nil).
	Resolver Resolver
}

// CredentialsLookup reads the credentials a proxy was built with.
type CredentialsLookup interface {
	Lookup(ctx context.Context, ref credentials.Ref) (credentials.Credentials, error)
}

// Broker is the one acquire path. Its methods are safe for concurrent use.
type Broker struct {
	opts  Options
	store lease.Store
	// listeners hear of session reports (the gateway).
	listeners sessionListeners
	// revoker tells proxies of released leases.
	revoker *revoker
	// narrowed remembers tenants' narrowed candidates.
	narrowed *narrowings
	// clients are the sessions' TLS fingerprints and the client bans.
	clients *clients
	// families remembers which hosts are reached over IPv6.
	families *hostFamilies
}

// New builds a broker; Run starts its revoker.
func New(opts Options) *Broker {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = lease.DefaultStoreTimeout
	}
	b := &Broker{opts: opts, store: boundedStore{store: opts.Store, timeout: opts.StoreTimeout}, narrowed: newNarrowings(), clients: newClients(),
		families: newHostFamilies(opts.Resolver, opts.Clock)}
	b.revoker = newRevoker(opts.Clock.Now, func(id string) bool {
		if opts.View == nil {
			return false
		}
		exists, _, _ := opts.View.state(id)
		return !exists
	})
	if opts.View != nil {
		opts.View.mu.Lock()
		opts.View.onMove = b.forgetMoved
		opts.View.mu.Unlock()
	}
	return b
}

// Run tells proxies of released leases until ctx ends.
func (b *Broker) Run(ctx context.Context) { b.revoker.run(ctx) }

// Store is the lease store, each call bounded and measured: for the
// API's reads and the ban judge.
func (b *Broker) Store() lease.Store { return b.store }

// View is the fleet the broker chooses from.
func (b *Broker) View() *View { return b.opts.View }

// Now is the broker's clock.
func (b *Broker) Now() time.Time { return b.opts.Clock.Now() }

// forgetMoved drops the cooldowns and outcome record of a proxy that came
// back on a new address (a replacement): they were about its old one. In
// the background, bounded as every store call; a failure is logged, and
// the old record fades by itself.
func (b *Broker) forgetMoved(id string) {
	go func() {
		if err := b.store.ForgetProxy(context.Background(), id); err != nil {
			logf.Log.WithName("broker").Error(err, "forgetting the cooldowns and record of a proxy that moved", "proxy", id)
		}
	}()
}

// record writes a ledger entry to the sink and the store. A record the
// store could not take is logged: the JSON-lines log still has it.
func (b *Broker) record(ctx context.Context, kind, event string, l lease.Lease, session string, until time.Time, bytes int64) {
	e := lease.LedgerEntry{At: b.opts.Clock.Now().UTC(), Kind: kind, Event: event, LeaseID: l.ID, Tenant: l.Holder, Session: session,
		Proxy: l.ProxyID, Target: l.Target, Start: l.CreatedAt.UTC(), Until: until.UTC(), Bytes: bytes}
	if info, ok := b.opts.View.Lookup(l.ProxyID, 0); ok {
		e.IP, e.IPv6 = info.IP, info.IPv6Prefix
		if info.ExitIP != info.IP {
			e.ExitIP = info.ExitIP
		}
	}
	if b.opts.Ledger != nil {
		b.opts.Ledger.Write(e)
	}
	if err := b.store.AppendLedger(ctx, e, b.ledgerRetention()); err != nil {
		operator.Warn(logf.FromContext(ctx), "a ledger record reached the log but not the lease store", "lease", l.ID, "error", err.Error())
	}
}

func (b *Broker) ledgerRetention() time.Duration {
	if b.opts.LedgerRetention > 0 {
		return b.opts.LedgerRetention
	}
	return lease.DefaultLedgerRetention
}
