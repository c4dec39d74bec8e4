package pool

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

// Pool metrics, one series per pool (a pool is a handful of series, not
// one per member).
var (
	membersGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "members",
		Help: "Members of a ProxyPool by state: available (Ready for minReadySeconds), unavailable (not yet or no longer), deleting.",
	}, []string{"namespace", "pool", "state"})
	desiredGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "desired_members",
		Help: "spec.replicas of a ProxyPool.",
	}, []string{"namespace", "pool"})
	floorGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "available_floor_members",
		Help: "The fewest available members a ProxyPool's budget allows: replicas - maxUnavailable.",
	}, []string{"namespace", "pool"})
	recyclingGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "recycling_members",
		Help: "Members of a ProxyPool being replaced (outdated, too old, Unhealthy too long, in the wrong zone).",
	}, []string{"namespace", "pool"})
	replacementsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "replacements_total",
		Help: "Members a ProxyPool retired, by cause (NoRoom, UnhealthyTooLong, Banned, TemplateChanged, MaxAge, ZoneRemoved, ZoneRebalance, ScaleDown).",
	}, []string{"namespace", "pool", "cause"})
	fullSlotsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "pool", Name: "full_slots",
		Help: "Zones (or providers) of a ProxyPool that get no new member now: a create there was refused for capacity or quota.",
	}, []string{"namespace", "pool"})
)

// Member states of proxy_operator_pool_members.
const (
	stateAvailable   = "available"
	stateUnavailable = "unavailable"
	stateDeleting    = "deleting"
)

func init() {
	ctrlmetrics.Registry.MustRegister(membersGauge, desiredGauge, floorGauge, recyclingGauge, replacementsTotal, fullSlotsGauge)
}

func recordMetrics(key types.NamespacedName, replicas int32, d Decision) {
	ns, name := key.Namespace, key.Name
	membersGauge.WithLabelValues(ns, name, stateAvailable).Set(float64(d.Available))
	membersGauge.WithLabelValues(ns, name, stateUnavailable).Set(float64(d.Replicas - d.Available))
	membersGauge.WithLabelValues(ns, name, stateDeleting).Set(float64(d.Deleting))
	desiredGauge.WithLabelValues(ns, name).Set(float64(replicas))
	floorGauge.WithLabelValues(ns, name).Set(float64(d.MinAvailable))
	recyclingGauge.WithLabelValues(ns, name).Set(float64(d.Recycling))
}

// forgetMetrics drops a deleted pool's series.
func forgetMetrics(key types.NamespacedName) {
	l := prometheus.Labels{"namespace": key.Namespace, "pool": key.Name}
	for _, v := range []*prometheus.GaugeVec{membersGauge, desiredGauge, floorGauge, recyclingGauge, fullSlotsGauge} {
		v.DeletePartialMatch(l)
	}
	replacementsTotal.DeletePartialMatch(l)
}
