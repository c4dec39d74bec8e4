package controllers

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/operator"
)

var (
	replacementsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "replacements_total",
		Help: "Instances replaced (same name, new IP), by provider instance and cause (SpecChanged, InstanceFailed, InstanceLost, UnhealthyTooLong, StartupTimeout, Banned, BurnedIP, StaleInstance).",
	}, []string{"provider", "cause"})
	replacementsHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "replacements_held_total",
		Help: "Passes that held back the due replacement of an Unhealthy proxy, by provider instance and reason: ProbeTargetSuspect (too many proxies probed against one URL fail at once) or ReplacementsBusy (the bound on replacements in flight).",
	}, []string{"provider", "reason"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(replacementsTotal, replacementsHeld)
}

// replacingIndex indexes Proxies in phase Replacing by the provider instance
// replacing them, so the replacements in flight are counted from the cache.
const replacingIndex = "status.replacingProvider"

func replacingProvider(obj client.Object) []string {
	p := obj.(*crawlv1alpha1.Proxy)
	if p.Status.Phase != crawlv1alpha1.PhaseReplacing {
		return nil
	}
	return []string{orProvider(p.Status.Provider, p.Spec.Provider)}
}

func orProvider(recorded, desired string) string {
	if recorded != "" {
		return recorded
	}
	return desired
}

func (r *ProxyReconciler) maxReplacements() int {
	if r.MaxReplacementsInFlight > 0 {
		return r.MaxReplacementsInFlight
	}
	return DefaultMaxReplacementsInFlight
}

// admitReplacement says whether p may start a budgeted replacement on its
// provider instance now, and how many are in flight there: those the cache
// shows Replacing, and those admitted that it does not show yet (the
// workers act faster than their status writes come back), so no two
// workers both take the last place.
func (r *ProxyReconciler) admitReplacement(ctx context.Context, p *crawlv1alpha1.Proxy, o observation) (int, bool) {
	var list crawlv1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.MatchingFields{replacingIndex: o.instanceProvider}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "counting replacements in flight; holding this one", "provider", o.instanceProvider)
		return 0, false
	}
	inFlight := sets.New[types.NamespacedName]()
	for i := range list.Items {
		inFlight.Insert(client.ObjectKeyFromObject(&list.Items[i]))
	}
	on := replacementOn(o.instanceProvider)
	r.budgetMu.Lock()
	defer r.budgetMu.Unlock()
	for _, k := range r.cache().tracker.Pending(func(payload any) bool { return payload == on }) {
		inFlight.Insert(k.NamespacedName)
	}
	key := client.ObjectKeyFromObject(p)
	n, admitted := admit(inFlight, key, r.maxReplacements())
	if admitted && !inFlight.Has(key) {
		r.cache().tracker.Wrote(lagKey(lagReplacement, key), p.ResourceVersion, on)
	}
	return n, admitted
}

// replacementOn is what the cache-lag tracker keeps with an admitted
// replacement: its provider instance.
type replacementOn string

// admit decides whether key may start a replacement where inFlight are
// in flight under bound, and how many are in flight with it. Pure.
func admit(inFlight sets.Set[types.NamespacedName], key types.NamespacedName, bound int) (int, bool) {
	switch {
	case inFlight.Has(key):
		return inFlight.Len(), true // already in flight: carry on
	case inFlight.Len() >= bound:
		return inFlight.Len(), false
	}
	return inFlight.Len() + 1, true
}

// releaseReplacement frees key's place once its replacement is over (its
// successor runs, or the Proxy is gone), without waiting for the cache to
// show it.
func (r *ProxyReconciler) releaseReplacement(key types.NamespacedName) {
	r.cache().tracker.Forget(lagKey(lagReplacement, key))
}
