package broker

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// Policy is a crawler team's declared politeness for one host (a
// CrawlTarget): the pace every proxy of its namespace keeps with the host.
type Policy struct {
	// Name is the policy's namespace/name.
	Name string `json:"name"`
	// Host is the host or wildcard domain ("*.example.com") it declares.
	Host string     `json:"host"`
	Pace lease.Pace `json:"-"`
	// ByNetwork counts Pace's per-IP numbers per network (the /24 of each
	// proxy's IPv4 exit IP, the identity's network of an IPv6 one) instead
	// of per sender (netid).
	ByNetwork bool `json:"-"`
}

// Policies are the declared politeness policies, by the namespace of the
// proxies they govern.
type Policies interface {
	// ForHost is the policy in force for host in each namespace that has
	// one (at most one per namespace, named namespace/name).
	ForHost(host string) []Policy
}

// Politeness configures how discovery and the gateway pace hosts.
type Politeness struct {
	// Policies are the declared ones (nil: none).
	Policies Policies
	// Adaptive applies the pace each host's push-backs taught the store.
	Adaptive bool
}

// paceOf is req's PaceOf for host: each candidate keeps the policy of its
// namespace (candidates and policies are namespace/name), counted per the
// sender sites see its exit IP as (netid: the IP, or the /64 of an IPv6
// one; a dual-stack proxy's IPv6 range's /64 for a host reached over
// IPv6), or per its network when the policy says so. Nil when no policy
// covers the host anywhere, so an unpaced lease keeps the store's fast
// path.
func (b *Broker) paceOf(ctx context.Context, host string) func(string) lease.Pace {
	if b.opts.Politeness.Policies == nil || host == "" {
		return nil
	}
	policies := b.opts.Politeness.Policies.ForHost(host)
	if len(policies) == 0 {
		return nil
	}
	byNamespace := make(map[string]Policy, len(policies))
	for _, p := range policies {
		ns, _, _ := strings.Cut(p.Name, "/")
		p.Pace = withJitterReserve(p.Pace)
		byNamespace[ns] = p
	}
	overIPv6 := b.families.overIPv6Of(ctx, host)
	return func(id string) lease.Pace {
		ns, _, _ := strings.Cut(id, "/")
		p := byNamespace[ns]
		switch {
		case b.opts.View == nil:
		case p.ByNetwork:
			p.Pace.Bucket = bucket("net:", b.opts.View.network(id, overIPv6))
		default:
			p.Pace.Bucket = bucket("ip:", b.opts.View.sender(id, overIPv6))
		}
		return p.Pace
	}
}

// bucket is the pace bucket of a sender or a network (kind "ip:" or
// "net:"); "" for none known: the proxy's own bucket then.
func bucket(kind, key string) string {
	if key == "" {
		return ""
	}
	return kind + key
}

// withJitterReserve keeps one request of a declared burst in reserve: the
// store paces when a request leaves, the site counts when it arrives, and
// the way between varies. Requests a burst of B-1 apart on the store's
// clock arrive within a site's bucket of B whatever the way's jitter (up
// to one interval), so a policy set to a site's published rules never
// trips them.
func withJitterReserve(p lease.Pace) lease.Pace {
	if p.Burst > 1 {
		p.Burst--
	}
	if p.FleetBurst > 1 {
		p.FleetBurst--
	}
	return p
}

// pushBack teaches the store that host pushed back, when the pace is
// adaptive; a failure is logged (the cooldown, if any, still holds).
func (b *Broker) pushBack(ctx context.Context, host string, retryAfter time.Duration) {
	if !b.opts.Politeness.Adaptive || host == "" {
		return
	}
	l, err := b.store.PushBack(ctx, host, retryAfter)
	if err != nil {
		operator.Warn(logf.FromContext(ctx), "could not slow the host's learned pace", "host", host, "error", err.Error())
		return
	}
	pushBacksTotal.Inc()
	logf.FromContext(ctx).V(1).Info("host pushed back: its pace slowed", "host", host, "interval", l.Interval.String())
}

var (
	pacedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "paced_refusals_total",
		Help: "Lease and tunnel requests refused because no proxy's pace or concurrency limit for the host allowed one within the wait, by cause (paced, concurrency).",
	}, []string{"cause"})
	pacedWaitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "paced_wait_seconds",
		Help:    "How far ahead paced requests reserved their slot.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
	})
	pushBacksTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "push_backs_total",
		Help: "Push-backs (429 or 503 from a site, reported or seen) that slowed a host's learned pace.",
	})
)

// notePaced counts a paced decision: a refusal by its cause, a grant by
// its wait.
func notePaced(err error, wait time.Duration) {
	if none, ok := err.(*lease.NoProxyAvailableError); ok && none.Paced() { //nolint:errorlint // the store's own type, never wrapped
		pacedTotal.WithLabelValues(none.Cause).Inc()
		return
	}
	if err == nil && wait > 0 {
		pacedWaitSeconds.Observe(wait.Seconds())
	}
}
