package health

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/operator"
)

var (
	probesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "total",
		Help: "Probes through proxies, by result (success, failure) and reason.",
	}, []string{"result", "reason"})
	probeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "duration_seconds",
		Help:    "Time one probe took: CONNECT, TLS through the tunnel, and the target's answer.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
	statusWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "status_writes_total",
		Help: "Proxy status writes by the health engine: a verdict change, a canary's verdict or exit IP learnt, or a recorded verdict or Ready that no longer holds (a new address, an instance that stopped serving).",
	})
	shardChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "shard_proxies_moved_total",
		Help: "Proxies this replica took up (gained) or handed over (lost) as the shard's members changed (--health-shard-probes).",
	}, []string{"direction"})
	idleProxies = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "idle_proxies",
		Help: "Proxies this replica probes at --health-idle-interval: Healthy, and without a live lease when traffic was last read.",
	})
	probesAsked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "healthcheck", Name: "asked_total",
		Help: "Probes asked for out of turn by a gateway tunnel that could not reach its proxy (at most one per proxy per 10s), by how the ask came: this_replica (the tunnel's own) or lease_store (passed on by another replica).",
	}, []string{"via"})
	canaryChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "canary", Name: "checks_total",
		Help: "Canary fetches through proxies (spec.healthCheck.targets), by canary name and verdict (Allowed, Blocked, Unknown).",
	}, []string{"canary", "verdict"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(probesTotal, probeDuration, statusWrites, shardChanges, idleProxies, probesAsked, canaryChecks)
}

func observeProbe(r Result, took time.Duration) {
	result := "failure"
	if r.Success {
		result = "success"
	}
	probesTotal.WithLabelValues(result, r.Reason).Inc()
	probeDuration.Observe(took.Seconds())
}

var lastProbeDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "healthcheck", "last_timestamp_seconds"),
	"Unix time of the last probe of each proxy (status records only verdict changes).",
	[]string{"namespace", "name"}, nil)

// LastProbeCollector exports proxy_operator_healthcheck_last_timestamp_seconds
// {namespace,name}, when the engine last finished probing each proxy. It
// reads the engine's own table at scrape time instead of keeping a gauge
// series per proxy: at 10,000 proxies those series held about 7 MB of the
// heap between scrapes (docs/performance.md).
func (e *Engine) LastProbeCollector() prometheus.Collector { return lastProbeCollector{e} }

type lastProbeCollector struct{ engine *Engine }

func (c lastProbeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lastProbeDesc }

func (c lastProbeCollector) Collect(ch chan<- prometheus.Metric) {
	type sample struct {
		key types.NamespacedName
		at  time.Time
	}
	// Copy under the lock and send after it: a slow scrape must not hold
	// up the probes' verdicts.
	e := c.engine
	e.mu.RLock()
	samples := make([]sample, 0, len(e.targets))
	for key, t := range e.targets {
		if !t.probedAt.IsZero() {
			samples = append(samples, sample{key, t.probedAt})
		}
	}
	e.mu.RUnlock()
	for _, s := range samples {
		ch <- prometheus.MustNewConstMetric(lastProbeDesc, prometheus.GaugeValue,
			float64(s.at.UnixNano())/1e9, s.key.Namespace, s.key.Name)
	}
}

// ProxiesCollector exports proxy_operator_proxies{phase,healthy}: how many
// Proxies are in each phase with each Healthy status. It counts at scrape
// time from the manager's cache, so it is never stale and costs no API call.
type ProxiesCollector struct {
	Reader client.Reader
}

var proxiesDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "", "proxies"),
	"Proxies by phase and by the status of their Healthy condition (True, False, Unknown).",
	[]string{"phase", "healthy"}, nil)

// Describe implements prometheus.Collector.
func (c ProxiesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- proxiesDesc }

// Collect implements prometheus.Collector.
func (c ProxiesCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list crawlv1alpha1.ProxyList
	if err := c.Reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(proxiesDesc, err)
		return
	}
	type key struct{ phase, healthy string }
	counts := map[key]int{}
	for i := range list.Items {
		p := &list.Items[i]
		healthy := "Unknown"
		if cond := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy); cond != nil {
			healthy = string(cond.Status)
		}
		phase := string(p.Status.Phase)
		if phase == "" {
			phase = string(crawlv1alpha1.PhasePending)
		}
		counts[key{phase, healthy}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(proxiesDesc, prometheus.GaugeValue, float64(n), k.phase, k.healthy)
	}
}
