package pool

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/controllers/cachelag"
)

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/finalizers,verbs=update
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxypools/scale,verbs=get;update
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;create;delete

// Finalizer keeps a ProxyPool until its members are gone: the pool deletes
// them itself, so no member outlives its pool even where no garbage
// collector runs, and each member's own finalizer removes its instance.
const Finalizer = "crawl.example.com/members-cleanup"

// Defaults of the rolling strategy, as a Deployment's but with no member
// down for a replacement.
var (
	DefaultMaxSurge       = intstr.FromInt32(1)
	DefaultMaxUnavailable = intstr.FromInt32(0)
)

// DefaultAutoscaleInterval is how often an autoscaled pool reads its
// demand with no event of its own, as an HPA's sync period.
const DefaultAutoscaleInterval = 15 * time.Second

// Reconciler keeps each ProxyPool's members as its spec says: one decide
// per pass, its creations and deletions carried out, and the status
// written from the same counts.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Clock is the time for decide; nil means the real clock.
	Clock clock.PassiveClock
	// Demand is where autoscaled pools read their use; nil: autoscaling
	// pools keep their size and say why (no discovery API runs).
	Demand DemandSource
	// AutoscaleInterval: zero means DefaultAutoscaleInterval.
	AutoscaleInterval time.Duration
	// Workers is how many pools are reconciled at once; zero means 2.
	Workers int

	lagOnce sync.Once
	lag     *cachelag.Tracker
	// full remembers the slots with no room (placement.go).
	full fullSlots
}

// Reconcile performs one pass for one pool.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	var pool crawlv1alpha1.ProxyPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			forgetMetrics(req.NamespacedName)
			r.forgetPool(req.NamespacedName)
			r.full.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var list crawlv1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{crawlv1alpha1.LabelPool: pool.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the members of ProxyPool %s: %w", req, err)
	}
	members := owned(&pool, list.Items)

	if !pool.DeletionTimestamp.IsZero() {
		return r.deleteMembers(ctx, &pool, members)
	}
	if !controllerutil.ContainsFinalizer(&pool, Finalizer) {
		patch := client.MergeFrom(pool.DeepCopy())
		controllerutil.AddFinalizer(&pool, Finalizer)
		if err := r.Client.Patch(ctx, &pool, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("adding the finalizer to ProxyPool %s: %w", req, err)
		}
	}
	now := r.clock().Now()
	if r.awaiting(req.NamespacedName, members) {
		// The cache has not caught up with the last pass's writes: acting
		// on it would create or delete twice.
		return reconcile.Result{RequeueAfter: expectationRecheck}, nil
	}

	status := pool.Status.DeepCopy()
	replicas := ptr.Deref(pool.Spec.Replicas, 1)
	if as := pool.Spec.Autoscaling; as != nil {
		scaled, err := r.autoscale(ctx, &pool, status, members, now)
		if err != nil || scaled {
			return reconcile.Result{}, err
		}
	} else {
		status.Autoscaling = nil
		setCondition(status, pool.Generation, crawlv1alpha1.ConditionScalingLimited, metav1.ConditionFalse, "AutoscalingOff", "spec.autoscaling is not set: the pool keeps spec.replicas")
	}

	hash := TemplateHash(&pool.Spec.Template)
	in := inputOf(&pool, replicas, members, hash, now)
	standard, reopens := r.placeAround(&pool, status, &in, now)
	d := decide(in)
	d.Recheck = sooner(d.Recheck, reopens)
	if err := r.carryOut(ctx, &pool, hash, d, members, standard); err != nil {
		return reconcile.Result{}, err
	}
	writeStatus(status, &pool, d, hash)
	recordMetrics(req.NamespacedName, replicas, d)
	if !equality.Semantic.DeepEqual(*status, pool.Status) {
		if err := r.applyStatus(ctx, &pool, *status); err != nil {
			return reconcile.Result{}, err
		}
	}
	result := reconcile.Result{RequeueAfter: d.Recheck}
	if pool.Spec.Autoscaling != nil {
		result.RequeueAfter = sooner(result.RequeueAfter, r.autoscaleInterval())
	}
	log.V(1).Info("pool pass", "created", len(d.Create), "deleted", len(d.Delete), "available", d.Available, "replicas", replicas)
	return result, nil
}

// owned keeps the listed Proxies that this pool controls: a Proxy that
// only carries the label (or an earlier pool's of the same name) is not
// a member.
func owned(pool *crawlv1alpha1.ProxyPool, proxies []crawlv1alpha1.Proxy) []crawlv1alpha1.Proxy {
	var out []crawlv1alpha1.Proxy
	for _, p := range proxies {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == pool.UID {
			out = append(out, p)
		}
	}
	return out
}

// autoscale writes the autoscaler's recommendation to spec.replicas when
// it differs; scaled is true when it did (the update brings a new pass).
func (r *Reconciler) autoscale(ctx context.Context, pool *crawlv1alpha1.ProxyPool, status *crawlv1alpha1.ProxyPoolStatus, members []crawlv1alpha1.Proxy, now time.Time) (scaled bool, err error) {
	if r.Demand == nil {
		setCondition(status, pool.Generation, crawlv1alpha1.ConditionScalingLimited, metav1.ConditionTrue, "DemandUnavailable",
			"the operator runs without the discovery API (--discovery-bind-address=0), so the pool has no demand to scale by: it keeps spec.replicas")
		return false, nil
	}
	current := ptr.Deref(pool.Spec.Replicas, 1)
	available := int32(decide(inputOf(pool, current, members, TemplateHash(&pool.Spec.Template), now)).Available)
	d, err := r.Demand.PoolDemand(ctx, pool.Namespace, pool.Name)
	if err != nil {
		// Without demand the pool keeps its size: a store outage must
		// neither grow nor shrink a fleet.
		setCondition(status, pool.Generation, crawlv1alpha1.ConditionScalingLimited, metav1.ConditionTrue, "DemandUnavailable",
			fmt.Sprintf("the discovery API's demand cannot be read (%v): the pool keeps spec.replicas until it can", err))
		logf.FromContext(ctx).Info("pool demand unavailable; keeping the pool's size", "error", err.Error())
		return false, nil
	}
	rec := recommend(pool.Spec.Autoscaling, current, available, d, status.Autoscaling, now)
	status.Autoscaling = &rec.Status
	limited := metav1.ConditionFalse
	if rec.Limited != ReasonDesiredWithin {
		limited = metav1.ConditionTrue
	}
	setCondition(status, pool.Generation, crawlv1alpha1.ConditionScalingLimited, limited, rec.Limited,
		fmt.Sprintf("demand asks for %d members (%s), bounded to [%d, %d]",
			rec.Wanted, demandOf(d, pool.Spec.Autoscaling.TargetLeasesPerMember), pool.Spec.Autoscaling.MinReplicas, pool.Spec.Autoscaling.MaxReplicas))
	if rec.Replicas == current {
		return false, nil
	}
	// The status first: a crash between the two writes then scales no
	// sooner than the delay allows.
	if err := r.applyStatus(ctx, pool, *status); err != nil {
		return false, err
	}
	// Through the scale subresource, as an HPA scales a Deployment: read
	// the Scale, then write it back with replicas set; its resourceVersion
	// makes a change made in between (a kubectl scale, a GitOps sync) a
	// conflict and a new pass rather than a lost write.
	scale := &autoscalingv1.Scale{}
	if err := r.Client.SubResource("scale").Get(ctx, pool, scale); err != nil {
		return false, fmt.Errorf("reading ProxyPool %s/%s's scale subresource: %w", pool.Namespace, pool.Name, err)
	}
	if scale.Spec.Replicas != rec.Replicas {
		scale.Spec.Replicas = rec.Replicas
		if err := r.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
			return false, fmt.Errorf("scaling ProxyPool %s/%s to %d through its scale subresource: %w", pool.Namespace, pool.Name, rec.Replicas, err)
		}
	}
	logf.FromContext(ctx).Info("autoscaled", "from", current, "to", rec.Replicas, "activeLeases", d.ActiveLeases, "heldExclusively", d.Held)
	r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, "Autoscaled", "Scale",
		"scaled from %d to %d members: %s", current, rec.Replicas, demandOf(d, pool.Spec.Autoscaling.TargetLeasesPerMember))
	return true, nil
}

// demandOf says what the autoscaler sized a pool by.
func demandOf(d Demand, target int32) string {
	s := fmt.Sprintf("%d active leases at %d per member", d.ActiveLeases, target)
	if d.Held > 0 {
		s += fmt.Sprintf(", %d members held by exclusive leases", d.Held)
	}
	return s
}

// carryOut creates and deletes what decide said (a member created in a
// slot of standard, standard instead of Spot), and expects to see it in
// the cache before the next pass acts.
func (r *Reconciler) carryOut(ctx context.Context, pool *crawlv1alpha1.ProxyPool, hash string, d Decision, members []crawlv1alpha1.Proxy, standard map[string]bool) error {
	log := logf.FromContext(ctx)
	key := client.ObjectKeyFromObject(pool)
	byName := map[string]*crawlv1alpha1.Proxy{}
	for i := range members {
		byName[members[i].Name] = &members[i]
	}
	for _, zone := range d.Create {
		m, err := newMember(pool, zone, hash, r.Client.Scheme())
		if err == nil && standard[zone] {
			m.Spec.Placement.DropSpot() // no Spot room there: a standard instance
		}
		if err != nil {
			return err
		}
		r.expectCreate(key, m.Name)
		if err := r.Client.Create(ctx, m); err != nil {
			r.forgetMember(key, m.Name)
			return fmt.Errorf("creating member %s of ProxyPool %s: %w", m.Name, key, err)
		}
		log.Info("member created", "member", m.Name, "provider", m.Spec.Provider, "zone", zone)
	}
	for _, ret := range d.Delete {
		m := byName[ret.Name]
		r.expectDelete(key, m)
		if err := r.Client.Delete(ctx, m, client.Preconditions{UID: &m.UID}); client.IgnoreNotFound(err) != nil {
			r.forgetMember(key, m.Name)
			return fmt.Errorf("deleting member %s of ProxyPool %s: %w", m.Name, key, err)
		}
		replacementsTotal.WithLabelValues(pool.Namespace, pool.Name, ret.Cause).Inc()
		log.Info("member retired", "member", m.Name, "cause", ret.Cause)
		r.Recorder.Eventf(pool, m, corev1.EventTypeNormal, "MemberRetired", "Delete", "retired member %s: %s", m.Name, causeText(ret.Cause))
	}
	return nil
}

// placeAround marks the slots of members refused for want of room (an
// Event for each newly marked one), gives decide the slots full now,
// writes the PlacementLimited condition, and returns the slots whose new
// members are standard instead of Spot, and how soon the first marked
// slot opens again.
func (r *Reconciler) placeAround(pool *crawlv1alpha1.ProxyPool, status *crawlv1alpha1.ProxyPoolStatus, in *Input, now time.Time) (map[string]bool, time.Duration) {
	key := client.ObjectKeyFromObject(pool)
	standardForSpot := pool.Spec.PlacementFallback != nil && pool.Spec.PlacementFallback.StandardForSpot
	newFull, newSpot := r.full.note(key, in.Members, standardForSpot, now)
	for _, slot := range newFull {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "PlacementFull", "Place",
			"no room in %s (its provider refused a member for capacity or quota): new members go elsewhere for %s", slotText(slot), FullSlotBackoff)
	}
	for _, slot := range newSpot {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "SpotFallback", "Place",
			"no Spot capacity in %s: new members there are standard instances for %s", slotText(slot), FullSlotBackoff)
	}
	full, spot, first := r.full.current(key, now)
	in.Full = full
	fullSlotsGauge.WithLabelValues(pool.Namespace, pool.Name).Set(float64(len(full) + len(spot)))
	if len(full) == 0 && len(spot) == 0 {
		setCondition(status, pool.Generation, crawlv1alpha1.ConditionPlacementLimited, metav1.ConditionFalse, "RoomEverywhere",
			"every zone and provider of the pool takes new members")
		return nil, 0
	}
	var parts []string
	reason := "NoRoom"
	if len(full) > 0 {
		parts = append(parts, fmt.Sprintf("no room in %s (capacity or quota): new members go to the pool's other zones and providers", fullText(full)))
	}
	if len(spot) > 0 {
		parts = append(parts, fmt.Sprintf("no Spot capacity in %s: new members there are standard instances", fullText(spot)))
		if len(full) == 0 {
			reason = "SpotFallback"
		}
	}
	setCondition(status, pool.Generation, crawlv1alpha1.ConditionPlacementLimited, metav1.ConditionTrue, reason,
		fmt.Sprintf("%s, until %s", strings.Join(parts, "; "), first.UTC().Format(time.RFC3339)))
	standard := make(map[string]bool, len(spot))
	for _, slot := range spot {
		standard[slot] = true
	}
	return standard, first.Sub(now)
}

// causeText says a cause in words, for the Event.
func causeText(cause string) string {
	switch cause {
	case CauseNoRoom:
		return "its provider had no room for it there (capacity or quota); its successor goes elsewhere"
	case CauseUnhealthy:
		return "Unhealthy for longer than its replacement period, its successor available"
	case CauseBanned:
		return "banned by the sites it crawls (its Banned condition), its successor available"
	case CauseTemplateChanged:
		return "made from an earlier template, its successor available"
	case CauseMaxAge:
		return "older than spec.maxAge, its successor available"
	case CauseZoneRemoved:
		return "its zone (or provider) is no longer in spec.zones (or spec.providers)"
	case CauseZoneRebalance:
		return "its zone (or provider) has more members than its share"
	}
	return "the pool has more members than spec.replicas"
}

// deleteMembers deletes every member of a pool being deleted and keeps
// the pool's finalizer until they are gone.
func (r *Reconciler) deleteMembers(ctx context.Context, pool *crawlv1alpha1.ProxyPool, members []crawlv1alpha1.Proxy) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, Finalizer) {
		return reconcile.Result{}, nil
	}
	for i := range members {
		if m := &members[i]; m.DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, fmt.Errorf("deleting member %s of ProxyPool %s/%s: %w", m.Name, pool.Namespace, pool.Name, err)
			}
		}
	}
	if len(members) > 0 {
		// The members' deletions bring the next pass; this is a backstop.
		return reconcile.Result{RequeueAfter: 10 * time.Second}, nil
	}
	patch := client.MergeFrom(pool.DeepCopy())
	controllerutil.RemoveFinalizer(pool, Finalizer)
	if err := r.Client.Patch(ctx, pool, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("removing the finalizer of ProxyPool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	forgetMetrics(client.ObjectKeyFromObject(pool))
	return reconcile.Result{}, nil
}

func (r *Reconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

func (r *Reconciler) autoscaleInterval() time.Duration {
	if r.AutoscaleInterval > 0 {
		return r.AutoscaleInterval
	}
	return DefaultAutoscaleInterval
}

// SetupWithManager runs the pool controller on the leader: a pass for a
// pool on its own changes and on any change of one of its members.
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	workers := r.Workers
	if workers == 0 {
		workers = 2
	}
	return builder.ControllerManagedBy(mgr).
		Named("proxypool").
		For(&crawlv1alpha1.ProxyPool{}).
		Owns(&crawlv1alpha1.Proxy{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
}
