package broker

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/lru"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// Clients: the TLS fingerprint (JA4) of the client behind each gateway
// session's tunnels, so that a session's report carries the fingerprint
// of the requests it is about (lease.Outcome.Client), and the marks of
// hosts that block one client through every proxy (lease.ClientBan), so
// that the gateway can tell such a client.
//
// The fingerprints are this replica's: the gateway that carried the
// session's last tunnel to a host saw it. A report that lands on another
// replica is recorded without one, and weighs as any block does.

// maxSessionClients bounds the (session, host) fingerprints remembered:
// the least recently seen go first.
const maxSessionClients = 1 << 16

// clientBansTTL is how long one read of the store's client bans serves.
const clientBansTTL = 5 * time.Second

// clients is the broker's fingerprints and its copy of the marks.
type clients struct {
	seen *lru.Cache // "<session>|<host>" -> fingerprint

	mu     sync.Mutex
	bans   map[lease.ClientBan]bool // Until left zero
	readAt time.Time
}

func newClients() *clients { return &clients{seen: lru.New(maxSessionClients)} }

// SawClient records that a tunnel of who's to host, on session (its key,
// Upstream.Session; "" rotating), came from the client whose fingerprint
// is client: the session's reports on host are about that client, and the
// tenant's next rotating tunnel likely is.
func (b *Broker) SawClient(who *tenant.Tenant, session, host, client string) {
	if client == "" {
		return
	}
	host = NormalizeTarget(host)
	if session != "" {
		b.clients.seen.Add(session+"|"+host, client)
	}
	if who != nil {
		b.clients.seen.Add(tenantClientKey(who)+"|"+host, client)
	}
}

// tenantClientKey keys a tenant's last client, apart from any session key
// (session keys hold no ' ').
func tenantClientKey(who *tenant.Tenant) string { return "tenant " + who.Name }

// bannedClient is the client of session (else of who) on host when host
// bans it ("": none, or not known here).
func (b *Broker) bannedClient(ctx context.Context, who *tenant.Tenant, session, host string) string {
	c := ""
	if session != "" {
		c = b.clientOf(session, host)
	}
	if c == "" {
		c = b.clientOf(tenantClientKey(who), host)
	}
	if c != "" && b.ClientBanned(ctx, host, c) {
		return c
	}
	return ""
}

// clientOf is the fingerprint last seen on session's tunnels to host ("":
// none here).
func (b *Broker) clientOf(session, host string) string {
	if v, ok := b.clients.seen.Get(session + "|" + host); ok {
		return v.(string)
	}
	return ""
}

// ClientBanned says whether host blocks client through every proxy (a mark
// of the ban judge's, read from the store at most every clientBansTTL; a
// store that cannot say leaves the last copy).
func (b *Broker) ClientBanned(ctx context.Context, host, client string) bool {
	if client == "" {
		return false
	}
	c := b.clients
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := b.opts.Clock.Now(); now.Sub(c.readAt) >= clientBansTTL {
		c.readAt = now
		bans, err := b.store.ClientBans(ctx)
		if err != nil {
			logf.FromContext(ctx).V(1).Info("reading the client bans; keeping the last copy", "error", err.Error())
		} else {
			c.bans = make(map[lease.ClientBan]bool, len(bans))
			for _, ban := range bans {
				c.bans[lease.ClientBan{Host: ban.Host, Client: ban.Client}] = true
			}
		}
	}
	return c.bans[lease.ClientBan{Host: NormalizeTarget(host), Client: client}]
}
