package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// Usage: what each team did at each site, per UTC day, kept in the lease
// store (so every replica counts into, and answers from, the same rows),
// and what it cost at each provider instance's prices.

// Price is what one provider instance's proxies cost.
type Price struct {
	// ProxyHour is one proxy for an hour: its VM or pod and its public
	// IPv4 address (which AWS bills apart).
	ProxyHour float64
	// GiB is one GiB carried through a proxy, either way.
	GiB float64
}

// Cost is c's cost at p.
func (p Price) Cost(c lease.UsageCounts) float64 {
	gib := float64(c.BytesUp+c.BytesDown) / (1 << 30)
	return c.ProxyHours()*p.ProxyHour + gib*p.GiB
}

// The dimensions a usage read groups by (UsageQuery.GroupBy).
const (
	GroupTenant   = "tenant"
	GroupHost     = "host"
	GroupDay      = "day"
	GroupProvider = "provider"
)

// UsageQuery is a read of the usage: the UTC days From to To, grouped by
// GroupBy (a subset of the Group* dimensions; the others are summed).
type UsageQuery struct {
	From, To time.Time
	GroupBy  []string
}

// MaxUsageDays bounds the days one read covers.
const MaxUsageDays = 400

// UsageRow is one group of a usage read: its dimensions (those grouped
// by), its counters, its proxy hours and, with prices configured, its cost.
type UsageRow struct {
	lease.UsageKey
	lease.UsageCounts
	ProxyHours float64 `json:"proxyHours"`
	// Cost is at the configured prices (the providers config's pricing),
	// in their currency; nil when no provider instance has a price.
	Cost *float64 `json:"cost,omitempty"`
}

// Usage reads the usage who may see: its own, or every team's for the
// platform and a tenant RBAC lets get proxies/usage cluster-wide.
func (b *Broker) Usage(ctx context.Context, who *tenant.Tenant, q UsageQuery) ([]UsageRow, error) {
	for _, g := range q.GroupBy {
		if !slices.Contains([]string{GroupTenant, GroupHost, GroupDay, GroupProvider}, g) {
			return nil, fmt.Errorf("%w: groupBy %q must be tenant, host, day or provider", ErrInvalidUsageQuery, g)
		}
	}
	from, to := lease.Day(q.From), lease.Day(q.To)
	if to < from || q.To.Sub(q.From) > MaxUsageDays*24*time.Hour {
		return nil, fmt.Errorf("%w: from %s to %s must be at most %d days, from first", ErrInvalidUsageQuery, from, to, MaxUsageDays)
	}
	all, err := b.MayReadUsage(ctx, who)
	if err != nil {
		return nil, err
	}
	rows, err := b.store.ReadUsage(ctx, from, to)
	if err != nil {
		return nil, err
	}
	priced := len(b.opts.Prices) > 0
	groups := map[lease.UsageKey]*UsageRow{}
	for k, c := range rows {
		if !all && k.Tenant != who.Name {
			continue
		}
		g := groupKey(k, q.GroupBy)
		row := groups[g]
		if row == nil {
			row = &UsageRow{UsageKey: g}
			if priced {
				row.Cost = new(float64)
			}
			groups[g] = row
		}
		row.Add(c)
		if priced {
			*row.Cost += b.opts.Prices[k.Provider].Cost(c)
		}
	}
	out := make([]UsageRow, 0, len(groups))
	for _, row := range groups {
		row.ProxyHours = row.UsageCounts.ProxyHours()
		if row.Cost != nil {
			*row.Cost = math.Round(*row.Cost*1e6) / 1e6
		}
		out = append(out, *row)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return strings.Compare(a.Day+"\x00"+a.Tenant+"\x00"+a.Host+"\x00"+a.Provider, b.Day+"\x00"+b.Tenant+"\x00"+b.Host+"\x00"+b.Provider)
	})
	return out, nil
}

// ErrInvalidUsageQuery marks a usage read the API answers 400.
var ErrInvalidUsageQuery = errors.New("invalid usage query")

// groupKey keeps of k the dimensions of groupBy.
func groupKey(k lease.UsageKey, groupBy []string) lease.UsageKey {
	var g lease.UsageKey
	for _, d := range groupBy {
		switch d {
		case GroupTenant:
			g.Tenant = k.Tenant
		case GroupHost:
			g.Host = k.Host
		case GroupDay:
			g.Day = k.Day
		case GroupProvider:
			g.Provider = k.Provider
		}
	}
	return g
}

// countUsage adds c to who's row for host through proxy today, and to the
// usage metrics. A store that does not answer loses the count, and says so
// in the log: usage never holds a lease or a tunnel up.
func (b *Broker) countUsage(ctx context.Context, who, host, proxy string, c lease.UsageCounts) {
	if who == "" {
		who = tenant.Anonymous.Name
	}
	k := lease.UsageKey{Day: lease.Day(b.opts.Clock.Now()), Tenant: who, Host: host, Provider: b.providerOf(proxy)}
	retention := b.opts.UsageRetention
	if retention <= 0 {
		retention = lease.DefaultUsageRetention
	}
	if err := b.store.CountUsage(ctx, k, c, retention); err != nil {
		operator.Warn(logf.FromContext(ctx), "usage was not counted", "tenant", who, "host", host, "error", err.Error())
	}
	b.observeUsage(who, host, c)
}

// countRefusal counts a site's refusal (blocked) or push-back
// (rate_limited) of who's request through proxy; other results count
// nothing.
func (b *Broker) countRefusal(ctx context.Context, who, host, proxy, result string) {
	switch result {
	case lease.ResultBlocked:
		b.countUsage(ctx, who, host, proxy, lease.UsageCounts{Blocks: 1})
	case lease.ResultRateLimited:
		b.countUsage(ctx, who, host, proxy, lease.UsageCounts{PushBacks: 1})
	}
}

// Carried is what a gateway tunnel or request carried, for its release.
type Carried struct {
	// Up and Down are the bytes to the site and from it.
	Up, Down int64
	// Requests are the requests the gateway saw (a plain or inspected
	// request: 1; an opaque tunnel: 0).
	Requests int64
}

// providerOf is the provider instance of proxy's row.
func (b *Broker) providerOf(proxy string) string {
	if b.opts.View != nil {
		if info, ok := b.opts.View.Lookup(proxy, 0); ok && info.Attributes[attrProvider] != "" {
			return info.Attributes[attrProvider]
		}
	}
	return lease.ProviderExternal
}

// observeUsage adds c to the usage metrics, whose labels stay bounded: a
// tenant is named only when a TenantQuota names it (or the platform), a
// host only when a CrawlTarget does; the rest count as "other".
func (b *Broker) observeUsage(who, host string, c lease.UsageCounts) {
	if _, ok := b.quotaNamed(who); !ok && who != tenant.PlatformName {
		who = usageOther
	}
	if b.opts.Politeness.Policies == nil || host == "" || len(b.opts.Politeness.Policies.ForHost(host)) == 0 {
		host = usageOther
	}
	for event, n := range map[string]int64{"lease": c.Leases, "tunnel": c.Tunnels, "request": c.Requests, "block": c.Blocks, "push_back": c.PushBacks} {
		if n > 0 {
			usageEvents.WithLabelValues(who, host, event).Add(float64(n))
		}
	}
	if c.BytesUp > 0 {
		usageBytes.WithLabelValues(who, host, "up").Add(float64(c.BytesUp))
	}
	if c.BytesDown > 0 {
		usageBytes.WithLabelValues(who, host, "down").Add(float64(c.BytesDown))
	}
}

// usageOther stands for the tenants and hosts the usage metrics do not
// name.
const usageOther = "other"

var (
	usageEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "usage_events_total",
		Help: "What crawler teams did, by tenant (those a TenantQuota names, and platform; the rest: other), host (those a CrawlTarget names; the rest: other) and event (lease, tunnel, request, block, push_back). GET /v1/usage has every tenant and host.",
	}, []string{"tenant", "host", "event"})
	usageBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "usage_bytes_total",
		Help: "Bytes the gateway carried for crawler teams, by tenant and host (bounded as proxy_operator_usage_events_total) and direction (up: to the site, down: from it).",
	}, []string{"tenant", "host", "direction"})
)
