package discovery

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

// count records one answer of route: its status and how long it took.
func (s *Server) count(route string, status int, took time.Duration) {
	requestsTotal.WithLabelValues(route, strconv.Itoa(status)).Inc()
	requestDuration.WithLabelValues(route).Observe(took.Seconds())
}

// statusRecorder keeps the status a handler wrote, for count.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "requests_total",
		Help: "Discovery API requests by route and HTTP status code.",
	}, []string{"route", "code"})
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "request_duration_seconds",
		Help:    "Discovery API request latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"route"})
	reportsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "reports_total",
		Help: "Lease reports by result (ok, error, rate_limited).",
	}, []string{"result"})
	authEnabled = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "auth_enabled",
		Help: "1 when the discovery API requires a bearer token, 0 when it serves unauthenticated (--discovery-auth=none).",
	})
	authLockedGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "discovery", Name: "auth_locked",
		Help: "1 while the discovery token Secret is missing or empty: every request is refused.",
	})
)

// metrics are the discovery API's own, registered with the manager's
// registry as every component's are; the store's counts come from its
// Collectors, which read a store instance.
var metrics = []prometheus.Collector{requestsTotal, requestDuration, reportsTotal, authEnabled, authLockedGauge}

func init() {
	ctrlmetrics.Registry.MustRegister(metrics...)
}
