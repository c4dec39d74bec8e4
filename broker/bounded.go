package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// boundedStore is how the server reaches its Store: every call is bounded
// by a timeout and measured, and any failure that is not an answer
// (ErrLeaseNotFound, no proxy available) becomes ErrStoreUnavailable, so
// the handlers tell "the store said no" from "the store did not answer" in
// one place, whatever the backend.
type boundedStore struct {
	store   lease.Store
	timeout time.Duration
}

func (b boundedStore) do(ctx context.Context, op string, call func(context.Context) error) error {
	return b.doWithin(ctx, op, b.timeout, call)
}

// scanTimeout bounds the calls that read a span of records rather than a
// key (the ledger for an attribution query, the blocks for the ban
// judge): neither is on a crawler's path, and a busy fleet's few minutes
// of ledger take longer to read than a lease takes to grant.
func (b boundedStore) scanTimeout() time.Duration {
	return max(10*b.timeout, MinScanTimeout)
}

// MinScanTimeout is the least a scan of the store (scanTimeout) may take.
const MinScanTimeout = 5 * time.Second

func (b boundedStore) doWithin(ctx context.Context, op string, timeout time.Duration, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	storeDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err == nil || errors.Is(err, lease.ErrLeaseNotFound) || errors.Is(err, lease.ErrNoProxyAvailable) || errors.Is(err, lease.ErrSessionNotFound) || errors.Is(err, lease.ErrQuotaExceeded) {
		return err
	}
	storeErrors.WithLabelValues(op).Inc()
	if errors.Is(err, lease.ErrStoreUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", lease.ErrStoreUnavailable, op, err)
}

func (b boundedStore) Admit(ctx context.Context, key string, interval time.Duration, burst int) error {
	return b.do(ctx, "admit", func(ctx context.Context) error { return b.store.Admit(ctx, key, interval, burst) })
}

func (b boundedStore) AddUsage(ctx context.Context, key string, n int64, ttl time.Duration) (total int64, err error) {
	err = b.do(ctx, "add_usage", func(ctx context.Context) error { total, err = b.store.AddUsage(ctx, key, n, ttl); return err })
	return total, err
}

func (b boundedStore) AppendLedger(ctx context.Context, e lease.LedgerEntry, retention time.Duration) error {
	return b.do(ctx, "append_ledger", func(ctx context.Context) error { return b.store.AppendLedger(ctx, e, retention) })
}

func (b boundedStore) ReadLedger(ctx context.Context, from, to time.Time) (out []lease.LedgerEntry, err error) {
	err = b.doWithin(ctx, "read_ledger", b.scanTimeout(), func(ctx context.Context) error { out, err = b.store.ReadLedger(ctx, from, to); return err })
	return out, err
}

func (b boundedStore) Acquire(ctx context.Context, req lease.AcquireRequest) (l lease.Lease, err error) {
	err = b.do(ctx, "acquire", func(ctx context.Context) error { l, err = b.store.Acquire(ctx, req); return err })
	return l, err
}

func (b boundedStore) Get(ctx context.Context, id string) (l lease.Lease, err error) {
	err = b.do(ctx, "get", func(ctx context.Context) error { l, err = b.store.Get(ctx, id); return err })
	return l, err
}

func (b boundedStore) Renew(ctx context.Context, id string, ttl time.Duration) (l lease.Lease, err error) {
	err = b.do(ctx, "renew", func(ctx context.Context) error { l, err = b.store.Renew(ctx, id, ttl); return err })
	return l, err
}

func (b boundedStore) Release(ctx context.Context, id string) error {
	return b.do(ctx, "release", func(ctx context.Context) error { return b.store.Release(ctx, id) })
}

func (b boundedStore) Report(ctx context.Context, id, result, target string, cooldown time.Duration) error {
	return b.do(ctx, "report", func(ctx context.Context) error { return b.store.Report(ctx, id, result, target, cooldown) })
}

func (b boundedStore) ActiveLeases(ctx context.Context, ids []string) (n []int, err error) {
	err = b.do(ctx, "active_leases", func(ctx context.Context) error { n, err = b.store.ActiveLeases(ctx, ids); return err })
	return n, err
}

func (b boundedStore) Held(ctx context.Context, ids []string) (held []bool, err error) {
	err = b.do(ctx, "held", func(ctx context.Context) error { held, err = b.store.Held(ctx, ids); return err })
	return held, err
}

func (b boundedStore) NoteRefused(ctx context.Context, pool string) error {
	return b.do(ctx, "note_refused", func(ctx context.Context) error { return b.store.NoteRefused(ctx, pool) })
}

func (b boundedStore) LastRefused(ctx context.Context, pool string) (t time.Time, err error) {
	err = b.do(ctx, "last_refused", func(ctx context.Context) error { t, err = b.store.LastRefused(ctx, pool); return err })
	return t, err
}

func (b boundedStore) AskProbe(ctx context.Context, proxy string) error {
	return b.do(ctx, "ask_probe", func(ctx context.Context) error { return b.store.AskProbe(ctx, proxy) })
}

func (b boundedStore) ProbesAsked(ctx context.Context, after int64) (proxies []string, next int64, err error) {
	err = b.do(ctx, "probes_asked", func(ctx context.Context) error { proxies, next, err = b.store.ProbesAsked(ctx, after); return err })
	return proxies, next, err
}

func (b boundedStore) Route(ctx context.Context, session, host string) (r lease.Route, err error) {
	err = b.do(ctx, "route", func(ctx context.Context) error { r, err = b.store.Route(ctx, session, host); return err })
	return r, err
}

func (b boundedStore) SetRoute(ctx context.Context, session, host string, set lease.RouteSet) error {
	return b.do(ctx, "set_route", func(ctx context.Context) error { return b.store.SetRoute(ctx, session, host, set) })
}

func (b boundedStore) ReportSession(ctx context.Context, r lease.SessionReport) (proxy string, err error) {
	err = b.do(ctx, "report_session", func(ctx context.Context) error {
		proxy, err = b.store.ReportSession(ctx, r)
		return err
	})
	return proxy, err
}

func (b boundedStore) MarkSession(ctx context.Context, session, proxy string, delta float64) (score float64, err error) {
	err = b.do(ctx, "mark_session", func(ctx context.Context) error {
		score, err = b.store.MarkSession(ctx, session, proxy, delta)
		return err
	})
	return score, err
}

func (b boundedStore) CountUsage(ctx context.Context, k lease.UsageKey, c lease.UsageCounts, retention time.Duration) error {
	return b.do(ctx, "count_usage", func(ctx context.Context) error { return b.store.CountUsage(ctx, k, c, retention) })
}

func (b boundedStore) ReadUsage(ctx context.Context, fromDay, toDay string) (rows map[lease.UsageKey]lease.UsageCounts, err error) {
	err = b.do(ctx, "read_usage", func(ctx context.Context) error { rows, err = b.store.ReadUsage(ctx, fromDay, toDay); return err })
	return rows, err
}

func (b boundedStore) Ping(ctx context.Context) error {
	return b.do(ctx, "ping", b.store.Ping)
}

var (
	storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "store_duration_seconds",
		Help:    "Lease store call latency by operation, failures included.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
	}, []string{"op"})
	storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "store_errors_total",
		Help: "Lease store calls that did not answer (timeout, connection refused, script error), by operation.",
	}, []string{"op"})
)

func (b boundedStore) PushBack(ctx context.Context, host string, retryAfter time.Duration) (l lease.Learned, err error) {
	err = b.do(ctx, "push_back", func(ctx context.Context) error { l, err = b.store.PushBack(ctx, host, retryAfter); return err })
	return l, err
}

func (b boundedStore) LearnedPace(ctx context.Context, host string) (l lease.Learned, err error) {
	err = b.do(ctx, "learned_pace", func(ctx context.Context) error { l, err = b.store.LearnedPace(ctx, host); return err })
	return l, err
}

func (b boundedStore) RecordOutcome(ctx context.Context, proxy, host string, o lease.Outcome) error {
	return b.do(ctx, "record_outcome", func(ctx context.Context) error { return b.store.RecordOutcome(ctx, proxy, host, o) })
}

func (b boundedStore) Outcomes(ctx context.Context, proxy string) (r []lease.HostRecord, err error) {
	err = b.do(ctx, "outcomes", func(ctx context.Context) error { r, err = b.store.Outcomes(ctx, proxy); return err })
	return r, err
}

func (b boundedStore) Blocks(ctx context.Context, since time.Time) (bl []lease.Block, err error) {
	err = b.doWithin(ctx, "blocks", b.scanTimeout(), func(ctx context.Context) error { bl, err = b.store.Blocks(ctx, since); return err })
	return bl, err
}

func (b boundedStore) Slot(ctx context.Context, proxy, target string, p lease.Pace, adaptive bool, maxWait time.Duration) (wait time.Duration, err error) {
	err = b.do(ctx, "slot", func(ctx context.Context) error {
		wait, err = b.store.Slot(ctx, proxy, target, p, adaptive, maxWait)
		return err
	})
	return wait, err
}

func (b boundedStore) EndCooldown(ctx context.Context, proxy, host string, notAfter time.Time) error {
	return b.do(ctx, "end_cooldown", func(ctx context.Context) error { return b.store.EndCooldown(ctx, proxy, host, notAfter) })
}

func (b boundedStore) ForgetProxy(ctx context.Context, proxy string) error {
	return b.do(ctx, "forget_proxy", func(ctx context.Context) error { return b.store.ForgetProxy(ctx, proxy) })
}

func (b boundedStore) BurnIP(ctx context.Context, scope, ip string, retention time.Duration) error {
	return b.do(ctx, "burn_ip", func(ctx context.Context) error { return b.store.BurnIP(ctx, scope, ip, retention) })
}

func (b boundedStore) MarkClientBan(ctx context.Context, host, client string, retention time.Duration) error {
	return b.do(ctx, "mark_client_ban", func(ctx context.Context) error { return b.store.MarkClientBan(ctx, host, client, retention) })
}

func (b boundedStore) ClientBans(ctx context.Context) (bans []lease.ClientBan, err error) {
	err = b.do(ctx, "client_bans", func(ctx context.Context) error { bans, err = b.store.ClientBans(ctx); return err })
	return bans, err
}

func (b boundedStore) BurnedUntil(ctx context.Context, scope, ip string) (t time.Time, err error) {
	err = b.do(ctx, "burned_until", func(ctx context.Context) error { t, err = b.store.BurnedUntil(ctx, scope, ip); return err })
	return t, err
}
