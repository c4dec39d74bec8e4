package shard

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

var (
	membersGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "shard", Name: "members",
		Help: "Replicas this one counts as live members of its shard group (the last listing of their Leases).",
	})
	handovers = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "shard", Name: "handovers_total",
		Help: "Changes of members that settled (stood for the handover delay), after which this replica took up what it gained.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(membersGauge, handovers)
}
