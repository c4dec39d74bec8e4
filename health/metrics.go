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
)

var (
	probesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_healthcheck_total",
		Help: "Probes through proxies, by result (success, failure) and reason.",
	}, []string{"result", "reason"})
	probeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "proxy_operator_healthcheck_duration_seconds",
		Help:    "Time one probe took: CONNECT, TLS through the tunnel, and the target's answer.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
	lastProbe = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_healthcheck_last_timestamp_seconds",
		Help: "Unix time of the last probe of each proxy (status records only verdict changes).",
	}, []string{"namespace", "name"})
	statusWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "proxy_operator_healthcheck_status_writes_total",
		Help: "Proxy status writes by the health engine: one per verdict change.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(probesTotal, probeDuration, lastProbe, statusWrites)
}

func observeProbe(key types.NamespacedName, r Result, took time.Duration, now time.Time) {
	result := "failure"
	if r.Success {
		result = "success"
	}
	probesTotal.WithLabelValues(result, r.Reason).Inc()
	probeDuration.Observe(took.Seconds())
	lastProbe.WithLabelValues(key.Namespace, key.Name).Set(float64(now.UnixNano()) / 1e9)
}

// ProxiesCollector exports proxy_operator_proxies{phase,healthy}: how many
// Proxies are in each phase with each Healthy status. It counts at scrape
// time from the manager's cache, so it is never stale and costs no API call.
type ProxiesCollector struct {
	Reader client.Reader
}

var proxiesDesc = prometheus.NewDesc("proxy_operator_proxies",
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
