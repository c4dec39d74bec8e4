package controllers

import (
	"context"
	"sync"
	"time"

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

// suspectedTargets remembers when each probe URL was last found suspect, so
// that proxies still Unhealthy as an outage ends are not replaced for it.
// It is the memory of an outage, not a guard against the cache's lag, so
// it is not the cache-lag tracker's.
// Every verdict change of a Managed proxy and every held replacement passes
// through it, so the memory is fresh while an outage lasts. It is lost on a
// restart, which errs toward replacing (after a full period) over keeping.
type suspectedTargets struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// note records h's URL as suspect now if it is, and returns when it last was.
func (s *suspectedTargets) note(h ProxyHealth, maxShare float64, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[string]time.Time{}
	}
	if targetSuspect(h.Unhealthy, h.Probed, maxShare) {
		s.last[h.URL] = now
	}
	return s.last[h.URL]
}
