package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
)

var instancesFoundChanged = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Name: "instances_found_changed_total",
	Help: "Ready proxies whose instance the instance watcher found gone, stopped or changed behind the operator's back, by provider instance.",
}, []string{"provider"})

func init() {
	ctrlmetrics.Registry.MustRegister(instancesFoundChanged)
}

// DefaultInstanceResyncInterval is how often the instances of Ready proxies
// that no watch covers (GCE VMs) are read again.
const DefaultInstanceResyncInterval = time.Minute

// InstanceWatcher is the watch that GCE does not offer: every Interval
// (jittered) it lists each provider instance's instances once, compares them
// with the Ready Managed Proxies recorded on it, and sends the reconciler
// every Proxy whose instance is gone, no longer running or not the one
// recorded. The reconciler then reads the instance itself and replaces it.
// Steady state costs one List per provider instance per interval, whatever
// the fleet's size. Providers whose instances are Kubernetes objects are
// watched already and skipped.
type InstanceWatcher struct {
	// Client reads Proxies from the manager's cache.
	Client client.Reader
	// Providers are the configured provider instances.
	Providers providers.Set
	// Owner selects this operator's instances.
	Owner providers.Owner
	// Interval between sweeps.
	Interval time.Duration
	// Triggers receives the Proxies to reconcile (the reconciler's Triggers).
	Triggers chan<- event.GenericEvent
}

// NeedLeaderElection makes the watcher run beside the reconciler, on the
// leader.
func (w *InstanceWatcher) NeedLeaderElection() bool { return true }

// Start sweeps every Interval until ctx ends.
func (w *InstanceWatcher) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("instance-watcher")
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		if err := w.Sweep(ctx); err != nil {
			log.Error(err, "instance sweep incomplete")
		}
	}, w.Interval, 0.2, false)
	return nil
}

// Sweep lists each unwatched provider instance that has Ready proxies and
// triggers those whose instance is not as recorded.
func (w *InstanceWatcher) Sweep(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("instance-watcher")
	var list crawlv1alpha1.ProxyList
	if err := w.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Proxies: %w", err)
	}
	ready := map[string][]*crawlv1alpha1.Proxy{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.Mode != crawlv1alpha1.ModeManaged || !p.Serving() || p.Status.InstanceName == "" {
			continue
		}
		prov, ok := w.Providers[p.Status.Provider]
		if _, watched := prov.(providers.ObjectBacked); !ok || watched {
			continue
		}
		ready[p.Status.Provider] = append(ready[p.Status.Provider], p)
	}
	var errs []error
	for name, proxies := range ready {
		instances, err := w.Providers[name].List(ctx, w.Owner)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing instances of provider %s: %w", name, err))
			continue
		}
		byName := make(map[string]*providers.Instance, len(instances))
		for i := range instances {
			byName[instances[i].Name] = &instances[i]
		}
		for _, p := range proxies {
			inst, found := byName[p.Status.InstanceName]
			why := instanceDiffers(p, inst, found)
			if why == "" {
				continue
			}
			instancesFoundChanged.WithLabelValues(name).Inc()
			log.Info("instance not as recorded", "proxy", client.ObjectKeyFromObject(p), "provider", name, "why", why)
			// A copy: the list shares the cache's objects.
			obj := &crawlv1alpha1.Proxy{}
			obj.Namespace, obj.Name = p.Namespace, p.Name
			select {
			case w.Triggers <- event.GenericEvent{Object: obj}:
			case <-ctx.Done():
				return errors.Join(append(errs, ctx.Err())...)
			}
		}
	}
	return errors.Join(errs...)
}

// instanceDiffers says why the listed instance is not the one a Ready Proxy
// records, or "" when it is. An instance made before the provider label
// existed is not listed; the reconciler's Get then finds it as it is, which
// costs one Get per sweep for such a proxy and changes nothing.
func instanceDiffers(p *crawlv1alpha1.Proxy, inst *providers.Instance, found bool) string {
	switch {
	case !found:
		return "not listed: deleted, or made before instances were labelled with their provider instance"
	case inst.State != providers.StateRunning:
		return fmt.Sprintf("state %s: %s", inst.State, orUnknown(inst.Message))
	case inst.OwnerUID() != string(p.UID):
		return "made for another Proxy of the same name"
	case inst.SpecHash() != p.Status.SpecHash:
		return "made from another spec"
	case inst.IP != p.Status.IP || inst.Port != p.Status.Port:
		return fmt.Sprintf("serves at %s:%d, recorded %s:%d", inst.IP, inst.Port, p.Status.IP, p.Status.Port)
	}
	return ""
}
