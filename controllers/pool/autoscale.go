package pool

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// Demand is what the discovery API saw of a pool's use: the leases its
// members hold now, the members exclusive leases hold (and the leases on
// them), and when a lease request that selected the pool was last refused
// for want of a member (zero: never).
type Demand struct {
	ActiveLeases int
	Held         int
	HeldLeases   int
	LastRefused  time.Time
}

// DemandSource reads a pool's demand. The operator's discovery server is
// one; the pool package never imports it. An error (the lease store does not
// answer) leaves the pool at its size.
type DemandSource interface {
	PoolDemand(ctx context.Context, namespace, pool string) (Demand, error)
}

// DefaultScaleDownDelay is how long demand must stay low before a pool
// shrinks when spec.autoscaling.scaleDownDelay is not set.
const DefaultScaleDownDelay = 5 * time.Minute

// starvedWindow: a refusal this recent means crawlers are going without.
const starvedWindow = 30 * time.Second

// Reasons of the ScalingLimited condition.
const (
	ReasonTooFewReplicas  = "TooFewReplicas"
	ReasonTooManyReplicas = "TooManyReplicas"
	ReasonDesiredWithin   = "DesiredWithinRange"
)

// Recommendation is the autoscaler's decision.
type Recommendation struct {
	// Replicas is what spec.replicas should be.
	Replicas int32
	// Limited is a ScalingLimited reason when the demand asked for more
	// than maxReplicas or fewer than minReplicas; ReasonDesiredWithin when
	// not.
	Limited string
	// Wanted is what demand asked for before the limits.
	Wanted int32
	// Status is the autoscaler's memory to write back.
	Status crawlv1alpha1.PoolAutoscalingStatus
}

// recommend sizes a pool from its demand. It is pure, so each rule is a
// table row in autoscale_test.go:
//
//   - wanted is the leases held over the target per member, rounded up,
//     where a member an exclusive lease holds is one member whatever
//     its leases;
//   - when a request was refused lately and every member is available
//     (the pool is not still growing), one member more than now;
//   - bounded by minReplicas and maxReplicas;
//   - up at once; down only once demand has asked for fewer members than
//     the pool has for the whole scale-down delay (or at once to
//     maxReplicas, when the pool was scaled beyond it).
func recommend(spec *crawlv1alpha1.PoolAutoscaling, current, available int32, d Demand, last *crawlv1alpha1.PoolAutoscalingStatus, now time.Time) Recommendation {
	target := max(spec.TargetLeasesPerMember, 1)
	shared := max(d.ActiveLeases-d.HeldLeases, 0)
	wanted := int32(d.Held + (shared+int(target)-1)/int(target))
	if !d.LastRefused.IsZero() && now.Sub(d.LastRefused) < starvedWindow && available >= current {
		wanted = max(wanted, current+1)
	}
	r := Recommendation{Wanted: wanted, Limited: ReasonDesiredWithin}
	bounded := wanted
	switch {
	case wanted > spec.MaxReplicas:
		bounded, r.Limited = spec.MaxReplicas, ReasonTooManyReplicas
	case wanted < spec.MinReplicas:
		bounded, r.Limited = spec.MinReplicas, ReasonTooFewReplicas
	}
	if last != nil {
		r.Status = *last.DeepCopy()
	}
	r.Status.DesiredReplicas, r.Status.ActiveLeases = bounded, int32(d.ActiveLeases)
	nowT := metav1.NewTime(now)
	delay := DefaultScaleDownDelay
	if spec.ScaleDownDelay != nil {
		delay = spec.ScaleDownDelay.Duration
	}
	r.Replicas = current
	switch {
	case bounded >= current || r.Status.LastHighDemandTime == nil:
		// Demand asks for at least what the pool has (or the autoscaler
		// has no memory yet: it starts the delay rather than shrink).
		r.Status.LastHighDemandTime = &nowT
		if bounded > current {
			r.Replicas = bounded
		}
	case current > spec.MaxReplicas || now.Sub(r.Status.LastHighDemandTime.Time) >= delay:
		r.Replicas = bounded
		// The delay starts again at the new size.
		r.Status.LastHighDemandTime = &nowT
	}
	if r.Replicas != current {
		r.Status.LastScaleTime = &nowT
	}
	return r
}
