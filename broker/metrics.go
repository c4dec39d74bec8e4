package broker

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// metrics are the broker's own, registered with the manager's registry as
// every component's are.
var metrics = []prometheus.Collector{storeDuration, storeErrors, pacedTotal, pacedWaitSeconds, pushBacksTotal, quotaRefusals, revocationsTotal, usageEvents, usageBytes}

func init() {
	ctrlmetrics.Registry.MustRegister(metrics...)
}
