package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

// Request kinds and outcomes, for the metrics.
const (
	kindConnect = "connect"
	kindHTTP    = "http"
	kindInspect = "inspect" // a CONNECT the gateway inspects (its requests count as http)

	outcomeOK             = "ok"
	outcomeQuota          = "quota"           // the tenant is at a TenantQuota limit: 429
	outcomeRefused        = "refused"         // unauthenticated, or a bad request
	outcomeBusy           = "busy"            // at MaxTunnels past SlotWait
	outcomeNoProxy        = "no_proxy"        // nothing to pick, or the store did not answer
	outcomePaced          = "paced"           // no proxy may take the host now (its pace, concurrency or cooldowns): 429
	outcomeUpstreamFailed = "upstream_failed" // every upstream tried failed
	outcomeSessionLost    = "session_lost"    // a strict session lost its proxy or ended: 502

	directionUp   = "up"   // client to site
	directionDown = "down" // site to client
)

func kindOf(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return kindConnect
	}
	return kindHTTP
}

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "requests_total",
		Help: "Gateway requests (CONNECT tunnels and plain-HTTP requests) by kind and outcome.",
	}, []string{"kind", "outcome"})
	tunnelsOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "tunnels_open",
		Help: "Tunnels open through the gateway now.",
	})
	tunnelsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "tunnels_closed_total",
		Help: "Tunnels closed, by reason: done, idle, lifetime, error, reported, shutdown, quota, lease_lost, paced.",
	}, []string{"reason"})
	tunnelDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "tunnel_duration_seconds",
		Help:    "How long tunnels stayed open.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	})
	connectDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "connect_duration_seconds",
		Help:    "Time from a client's CONNECT to an upstream's 200, retries included.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	bytesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "bytes_total",
		Help: "Bytes carried by the gateway, by direction: up (client to site), down (site to client).",
	}, []string{"direction"})
	errorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "errors_total",
		Help: "Answers the gateway gave itself instead of a site's, by their Proxy-Status error type (RFC 9209) and cause (the first word of its details).",
	}, []string{"error", "cause"})
	upstreamFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "upstream_failures_total",
		Help: "Upstream proxies that failed a tunnel or request, by reason: dial, timeout, auth, refused, upstream, protocol.",
	}, []string{"reason"})
	lateSlots = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "late_slots_total",
		Help: "Requests to a paced host whose connection or handshake came more than 10ms after their slot, by outcome: retaken (they waited for a slot of their own rather than fall closer than the pace to the next request) or sent_late (the pace had none within --gateway-pace-wait).",
	}, []string{"outcome"})
	turnsPaced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "paced_turns_total",
		Help: "Requests inside tunnels to a paced host after their first (a TLS record that may hold one; a plain-HTTP turn), by outcome: sent (at once or after waiting for the slot) or refused (no slot within the tunnel's idle timeout: the tunnel closed).",
	}, []string{"outcome"})
	clientHellos = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "client_hellos_total",
		Help: "Tunnels by what their client's first bytes were: read (a ClientHello, its JA4 fingerprint kept beside the session's outcomes), not_tls, or unreadable (cut short or too large).",
	}, []string{"result"})
	inspectRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "inspect_retries_total",
		Help: "Inspected idempotent requests the site refused the IP (a 403 or a block page), tried once more on another upstream.",
	})
	bannedClientTunnels = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "gateway", Name: "banned_client_tunnels_total",
		Help: "Tunnels whose client's TLS fingerprint their host bans through every proxy (the ban judge's client bans): the CONNECT answer's Proxy-Status says so.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(requestsTotal, errorsTotal, tunnelsOpen, tunnelsClosed, tunnelDuration, connectDuration, bytesTotal, upstreamFailures,
		turnsPaced, lateSlots, clientHellos, bannedClientTunnels, inspectRetries)
}
