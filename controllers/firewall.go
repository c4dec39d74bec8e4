package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
)

var firewallSyncErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Name: "firewall_sync_errors_total",
	Help: "Failed attempts to create or update a provider instance's firewall rule, by provider instance.",
}, []string{"provider"})

func init() { ctrlmetrics.Registry.MustRegister(firewallSyncErrors) }

// DefaultFirewallSyncInterval is how often the FirewallKeeper puts each
// rule back in line with the config: a rule edited by hand is closed again
// within it.
const DefaultFirewallSyncInterval = time.Minute

// FirewallKeeper keeps the firewall rule of every provider instance that has
// one (providers.Firewalled) as its config says, from startup on and every
// Interval. Removing the rules of provider instances that left the config is
// the OrphanCollector's, with its dry-run.
type FirewallKeeper struct {
	Providers providers.Set
	Owner     providers.Owner
	Interval  time.Duration
}

// NeedLeaderElection makes the keeper run on the leader only.
func (k *FirewallKeeper) NeedLeaderElection() bool { return true }

// Start syncs every Interval until ctx ends.
func (k *FirewallKeeper) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("firewall")
	interval := k.Interval
	if interval <= 0 {
		interval = DefaultFirewallSyncInterval
	}
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		for _, name := range k.Providers.Names() {
			guard, ok := k.Providers[name].(providers.Firewalled)
			if !ok {
				continue
			}
			if err := guard.EnsureFirewall(ctx, k.Owner); err != nil {
				firewallSyncErrors.WithLabelValues(name).Inc()
				log.Error(err, "keeping the firewall rule", "provider", name)
			}
		}
	}, interval, 0.1, true)
	return nil
}
