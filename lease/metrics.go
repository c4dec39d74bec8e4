package lease

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/example/egress-proxies-operator/operator"
)

// The lease store's gauges, the same for every backend.

// CountCollectors are the leases_active and cooldowns_active gauges over a
// store's counts, read at scrape time, for every backend alike; a store
// that cannot count then reports them invalid rather than a wrong zero.
func CountCollectors(counts func() (leases, cooldowns int, err error)) []prometheus.Collector {
	return []prometheus.Collector{&countCollector{counts: counts}}
}

var (
	leasesActiveDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "discovery", "leases_active"),
		"Leases not yet released or expired.", nil, nil)
	cooldownsActiveDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "discovery", "cooldowns_active"),
		"(proxy, target) pairs cooling down after a rate_limited report.", nil, nil)
)

type countCollector struct {
	counts func() (int, int, error)
}

func (c *countCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesActiveDesc
	ch <- cooldownsActiveDesc
}

func (c *countCollector) Collect(ch chan<- prometheus.Metric) {
	leases, cooldowns, err := c.counts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(leasesActiveDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(leasesActiveDesc, prometheus.GaugeValue, float64(leases))
	ch <- prometheus.MustNewConstMetric(cooldownsActiveDesc, prometheus.GaugeValue, float64(cooldowns))
}
