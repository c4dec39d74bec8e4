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
)

var (
	replacementsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_replacements_total",
		Help: "Instances replaced (same name, new IP), by provider instance and cause (SpecChanged, InstanceFailed, InstanceLost, UnhealthyTooLong, StaleInstance).",
	}, []string{"provider", "cause"})
	replacementsHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_replacements_held_total",
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
// provider instance now, and how many are in flight there.
func (r *ProxyReconciler) admitReplacement(ctx context.Context, p *crawlv1alpha1.Proxy, o observation) (int, bool) {
	var list crawlv1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.MatchingFields{replacingIndex: o.instanceProvider}, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "counting replacements in flight; holding this one", "provider", o.instanceProvider)
		return 0, false
	}
	cached := sets.New[types.NamespacedName]()
	for i := range list.Items {
		cached.Insert(client.ObjectKeyFromObject(&list.Items[i]))
	}
	return r.budget.admit(o.instanceProvider, client.ObjectKeyFromObject(p), cached, r.maxReplacements(), o.now)
}

// replacementBudget bounds the budgeted replacements in flight per provider
// instance. What is in flight is what the cache shows in phase Replacing,
// together with what this process started and the cache may not show yet
// (the 8 workers act faster than their status writes come back), so no two
// workers both take the last place.
type replacementBudget struct {
	mu      sync.Mutex
	started map[types.NamespacedName]startedReplacement
}

type startedReplacement struct {
	provider string
	at       time.Time
}

// startedMemory is how long a started replacement counts though the cache
// does not show it Replacing and the executor has not released it: longer
// than any status write takes to come back through the watch, short enough
// that a lost write frees its place.
const startedMemory = time.Minute

// admit takes a place for key on provider, unless bound places are taken.
// cached are the Proxies the cache shows Replacing on provider.
func (b *replacementBudget) admit(provider string, key types.NamespacedName, cached sets.Set[types.NamespacedName], bound int, now time.Time) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started == nil {
		b.started = map[types.NamespacedName]startedReplacement{}
	}
	inFlight := cached.Clone()
	for k, s := range b.started {
		switch {
		case now.Sub(s.at) > startedMemory:
			delete(b.started, k)
		case s.provider == provider:
			inFlight.Insert(k)
		}
	}
	if inFlight.Has(key) {
		return inFlight.Len(), true // already in flight: carry on
	}
	if inFlight.Len() >= bound {
		return inFlight.Len(), false
	}
	b.started[key] = startedReplacement{provider: provider, at: now}
	return inFlight.Len() + 1, true
}

// release frees key's place once its replacement is over (its successor
// runs, or the Proxy is gone), without waiting for the cache to show it.
func (b *replacementBudget) release(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.started, key)
}

// suspectedTargets remembers when each probe URL was last found suspect, so
// that proxies still Unhealthy as an outage ends are not replaced for it.
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
