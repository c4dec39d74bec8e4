package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	toolscache "k8s.io/client-go/tools/cache"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/feed"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
)

// Quota is a tenant's share of the fleet (its TenantQuota). A nil cap and
// a zero rate or volume are no limit.
type Quota struct {
	// Source names the TenantQuota (namespace/name), for messages.
	Source                string
	MaxLeases, MaxTunnels *int
	TunnelsPerSecond      int
	GatewayBytesPerDay    int64
}

// Quotas says what a tenant's share is (QuotaIndex).
type Quotas interface {
	QuotaOf(tenantName string) (Quota, bool)
}

// QuotaIndex is the TenantQuotas the manager's cache holds, by the tenant
// each bounds. An informer feeds it (Handler).
type QuotaIndex struct {
	mu       sync.RWMutex
	byTenant map[string]Quota
}

var _ Quotas = (*QuotaIndex)(nil)

// NewQuotaIndex returns an empty index.
func NewQuotaIndex() *QuotaIndex { return &QuotaIndex{byTenant: map[string]Quota{}} }

// QuotaOf implements Quotas.
func (x *QuotaIndex) QuotaOf(tenantName string) (Quota, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	q, ok := x.byTenant[tenantName]
	return q, ok
}

// Handler is the informer handler that keeps the index current.
func (x *QuotaIndex) Handler() toolscache.ResourceEventHandler {
	return feed.Handler(x.upsert, func(q *crawlv1alpha1.TenantQuota) {
		x.mu.Lock()
		defer x.mu.Unlock()
		delete(x.byTenant, q.ServiceAccountUser())
	})
}

func (x *QuotaIndex) upsert(q *crawlv1alpha1.TenantQuota) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byTenant[q.ServiceAccountUser()] = QuotaOf(q)
}

// QuotaOf reads a TenantQuota's limits.
func QuotaOf(q *crawlv1alpha1.TenantQuota) Quota {
	out := Quota{Source: q.Namespace + "/" + q.Name}
	toInt := func(p *int32) *int {
		if p == nil {
			return nil
		}
		n := int(*p)
		return &n
	}
	out.MaxLeases, out.MaxTunnels = toInt(q.Spec.MaxLeases), toInt(q.Spec.MaxTunnels)
	if q.Spec.TunnelsPerSecond != nil {
		out.TunnelsPerSecond = int(*q.Spec.TunnelsPerSecond)
	}
	if q.Spec.GatewayBytesPerDay != nil {
		out.GatewayBytesPerDay = q.Spec.GatewayBytesPerDay.Value()
	}
	return out
}

// The limits a refusal names, in metrics and error messages.
const (
	LimitLeases           = "leases"
	LimitTunnels          = "tunnels"
	LimitTunnelsPerSecond = "tunnels_per_second"
	LimitBytesPerDay      = "gateway_bytes_per_day"
)

// QuotaError is a tenant's request refused at one of its limits: the
// discovery API and the gateway answer it 429 with Retry-After.
type QuotaError struct {
	Tenant, Limit, Source string
	RetryAfter            time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%s is at its %s quota (TenantQuota %s); retry in %s", e.Tenant, e.Limit, e.Source, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrQuotaExceeded) hold.
func (e *QuotaError) Unwrap() error { return lease.ErrQuotaExceeded }

// quotaOf is t's quota, if it has one.
func (b *Broker) quotaOf(t *tenant.Tenant) (Quota, bool) {
	if t == nil || t.All() {
		return Quota{}, false
	}
	return b.quotaNamed(t.Name)
}

// quotaNamed is the quota of the tenant called name, if it has one.
func (b *Broker) quotaNamed(name string) (Quota, bool) {
	if b.opts.Quotas == nil {
		return Quota{}, false
	}
	return b.opts.Quotas.QuotaOf(name)
}

// limitFor is the Limit a tenant's lease (kind LimitLeases) or tunnel
// (LimitTunnels) counts under; the zero Limit when it has none.
func (b *Broker) limitFor(t *tenant.Tenant, kind string) lease.Limit {
	q, ok := b.quotaOf(t)
	if !ok {
		return lease.Limit{}
	}
	limit := q.MaxLeases
	if kind == LimitTunnels {
		limit = q.MaxTunnels
	}
	if limit == nil {
		return lease.Limit{}
	}
	return lease.Limit{Key: kind + "|" + t.Name, Max: *limit}
}

// quotaError turns the store's refusal of a tenant's lease or tunnel into
// a QuotaError naming the limit, and counts it; other errors pass.
func (b *Broker) quotaError(t *tenant.Tenant, limit string, err error) error {
	var over *lease.QuotaExceededError
	if !errors.As(err, &over) {
		return err
	}
	q, _ := b.quotaOf(t)
	quotaRefusals.WithLabelValues(t.Name, limit).Inc()
	return &QuotaError{Tenant: t.Name, Limit: limit, Source: q.Source, RetryAfter: over.RetryAfter}
}

// bytesKey is the usage key of a tenant's gateway bytes on the UTC day of
// now.
func bytesKey(tenantName string, now time.Time) string {
	return "bytes|" + tenantName + "|" + now.UTC().Format(time.DateOnly)
}

// Admit lets a tenant's gateway client open one tunnel (or send one
// plain-HTTP request) under its tunnels-per-second and bytes-per-day
// limits, or returns a *QuotaError. The lease each tunnel takes counts
// toward its maxTunnels in Pick.
func (b *Broker) Admit(ctx context.Context, who *tenant.Tenant) error {
	q, ok := b.quotaOf(who)
	if !ok {
		return nil
	}
	if q.GatewayBytesPerDay > 0 {
		now := b.opts.Clock.Now().UTC()
		used, err := b.store.AddUsage(ctx, bytesKey(who.Name, now), 0, 48*time.Hour)
		if err != nil {
			return err
		}
		if used >= q.GatewayBytesPerDay {
			midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
			return b.quotaError(who, LimitBytesPerDay, &lease.QuotaExceededError{RetryAfter: midnight.Sub(now)})
		}
	}
	if q.TunnelsPerSecond > 0 {
		err := b.store.Admit(ctx, "tunnels|"+who.Name, time.Second/time.Duration(q.TunnelsPerSecond), q.TunnelsPerSecond)
		return b.quotaError(who, LimitTunnelsPerSecond, err)
	}
	return nil
}

// CountBytes adds n bytes that a tunnel or request of who's carried to
// who's day, when who has a gatewayBytesPerDay, and says whether the day's
// bytes are now spent: the gateway then cuts who's tunnels. The count is
// the tenant's, not a lease's, so bytes moved after a lease expired or
// failed to renew count all the same. A count the store could not take is
// logged and spends nothing.
func (b *Broker) CountBytes(ctx context.Context, who *tenant.Tenant, n int64) (spent bool) {
	q, ok := b.quotaOf(who)
	if !ok || q.GatewayBytesPerDay <= 0 {
		return false
	}
	used, err := b.store.AddUsage(ctx, bytesKey(who.Name, b.opts.Clock.Now()), max(n, 0), 48*time.Hour)
	if err != nil {
		operator.Warn(logf.FromContext(ctx), "bytes were not counted toward their tenant's quota", "tenant", who.Name, "error", err.Error())
		return false
	}
	return used >= q.GatewayBytesPerDay
}

// MetersBytes says whether who has a gatewayBytesPerDay: the gateway counts
// its tunnels' bytes as they move.
func (b *Broker) MetersBytes(who *tenant.Tenant) bool {
	q, ok := b.quotaOf(who)
	return ok && q.GatewayBytesPerDay > 0
}

var quotaRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Name: "tenant_quota_refusals_total",
	Help: "Requests refused at a tenant's TenantQuota, by tenant (only tenants with a TenantQuota, so the label is bounded by those objects) and limit (leases, tunnels, tunnels_per_second, gateway_bytes_per_day).",
}, []string{"tenant", "limit"})
