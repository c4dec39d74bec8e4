package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func TestRecommend(t *testing.T) {
	spec := &crawlv1alpha1.PoolAutoscaling{MinReplicas: 2, MaxReplicas: 10, TargetLeasesPerMember: 4, ScaleDownDelay: &metav1.Duration{Duration: time.Minute}}
	highAgo := func(d time.Duration) *crawlv1alpha1.PoolAutoscalingStatus {
		at := metav1.NewTime(t0.Add(-d))
		return &crawlv1alpha1.PoolAutoscalingStatus{LastHighDemandTime: &at}
	}
	cases := []struct {
		name               string
		current, available int32
		demand             Demand
		last               *crawlv1alpha1.PoolAutoscalingStatus
		want               int32
		wantLimited        string
	}{
		{name: "leases over the target grow the pool at once", current: 3, available: 3, demand: Demand{ActiveLeases: 17}, last: highAgo(time.Second),
			want: 5, wantLimited: ReasonDesiredWithin},
		{name: "exactly the target per member: stays", current: 4, available: 4, demand: Demand{ActiveLeases: 16}, last: highAgo(time.Hour),
			want: 4, wantLimited: ReasonDesiredWithin},
		{name: "an exclusively held member is a whole member, whatever its leases", current: 3, available: 3,
			demand: Demand{ActiveLeases: 10, Held: 2, HeldLeases: 2}, last: highAgo(time.Hour),
			want: 4, wantLimited: ReasonDesiredWithin},
		{name: "a recent refusal with every member available adds one", current: 3, available: 3, demand: Demand{ActiveLeases: 2, LastRefused: t0.Add(-5 * time.Second)}, last: highAgo(time.Hour),
			want: 4, wantLimited: ReasonDesiredWithin},
		{name: "a refusal while members are still coming up adds none", current: 4, available: 3, demand: Demand{ActiveLeases: 12, LastRefused: t0.Add(-5 * time.Second)}, last: highAgo(time.Second),
			want: 4, wantLimited: ReasonDesiredWithin},
		{name: "an old refusal is not starvation", current: 3, available: 3, demand: Demand{ActiveLeases: 12, LastRefused: t0.Add(-time.Minute)}, last: highAgo(time.Second),
			want: 3, wantLimited: ReasonDesiredWithin},
		{name: "capped at maxReplicas, and says so", current: 8, available: 8, demand: Demand{ActiveLeases: 100}, last: highAgo(time.Second),
			want: 10, wantLimited: ReasonTooManyReplicas},
		{name: "no demand: held at minReplicas, and says so", current: 2, available: 2, last: highAgo(time.Hour),
			want: 2, wantLimited: ReasonTooFewReplicas},
		{name: "below minReplicas (scaled by hand): up at once", current: 1, available: 1, last: highAgo(time.Second),
			want: 2, wantLimited: ReasonTooFewReplicas},
		{name: "above maxReplicas (scaled by hand): down at once", current: 14, available: 14, demand: Demand{ActiveLeases: 100}, last: highAgo(time.Second),
			want: 10, wantLimited: ReasonTooManyReplicas},
		{name: "low demand within the delay: no shrink yet", current: 6, available: 6, demand: Demand{ActiveLeases: 12}, last: highAgo(30 * time.Second),
			want: 6, wantLimited: ReasonDesiredWithin},
		{name: "low demand for the whole delay: shrinks to what is wanted", current: 6, available: 6, demand: Demand{ActiveLeases: 4}, last: highAgo(time.Minute),
			want: 2, wantLimited: ReasonTooFewReplicas},
		{name: "no memory (a new pool, a restart): starts the delay instead of shrinking", current: 6, available: 6, demand: Demand{ActiveLeases: 12},
			want: 6, wantLimited: ReasonDesiredWithin},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := recommend(spec, tc.current, tc.available, tc.demand, tc.last, t0)
			assert.Equal(t, tc.want, r.Replicas, "replicas")
			assert.Equal(t, tc.wantLimited, r.Limited, "limited")
			assert.Equal(t, int32(tc.demand.ActiveLeases), r.Status.ActiveLeases)
			if tc.want != tc.current {
				if assert.NotNil(t, r.Status.LastScaleTime) {
					assert.Equal(t, t0, r.Status.LastScaleTime.Time)
				}
			}
		})
	}
}

// TestRecommendGrowsThenShrinksAfterTheDelay plays recommend over time:
// a burst of leases grows the pool at once; when it ends, the pool keeps
// its size for the delay, then shrinks.
func TestRecommendGrowsThenShrinksAfterTheDelay(t *testing.T) {
	spec := &crawlv1alpha1.PoolAutoscaling{MinReplicas: 1, MaxReplicas: 10, TargetLeasesPerMember: 2, ScaleDownDelay: &metav1.Duration{Duration: time.Minute}}
	var last *crawlv1alpha1.PoolAutoscalingStatus
	current := int32(1)
	step := func(at time.Duration, leases int) int32 {
		r := recommend(spec, current, current, Demand{ActiveLeases: leases}, last, t0.Add(at))
		current, last = r.Replicas, &r.Status
		return current
	}
	assert.Equal(t, int32(1), step(0, 1))
	assert.Equal(t, int32(5), step(10*time.Second, 10), "burst: up at once")
	assert.Equal(t, int32(5), step(20*time.Second, 0), "burst over: held")
	assert.Equal(t, int32(5), step(69*time.Second, 0), "still within the delay since the last high demand (10s)")
	assert.Equal(t, int32(1), step(71*time.Second, 0), "delay over: down")
}

// unreachableDemand is a DemandSource whose store does not answer.
type unreachableDemand struct{}

func (unreachableDemand) PoolDemand(context.Context, string, string) (Demand, error) {
	return Demand{}, errors.New("lease store unavailable: dial tcp 127.0.0.1:6379: connect: connection refused")
}

// TestAutoscaleKeepsTheSizeWithoutDemand: when discovery's store does not
// answer, an autoscaled pool neither grows nor shrinks, writes nothing, and
// says why in ScalingLimited.
func TestAutoscaleKeepsTheSizeWithoutDemand(t *testing.T) {
	r := &Reconciler{Demand: unreachableDemand{}} // no client: any write would panic
	pool := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu", Generation: 3},
		Spec: crawlv1alpha1.ProxyPoolSpec{Replicas: ptr.To(int32(6)),
			Autoscaling: &crawlv1alpha1.PoolAutoscaling{MinReplicas: 2, MaxReplicas: 10, TargetLeasesPerMember: 4}},
	}
	status := &crawlv1alpha1.ProxyPoolStatus{}
	scaled, err := r.autoscale(context.Background(), pool, status, nil, t0)
	require.NoError(t, err)
	assert.False(t, scaled)
	assert.Equal(t, int32(6), *pool.Spec.Replicas)
	c := meta.FindStatusCondition(status.Conditions, crawlv1alpha1.ConditionScalingLimited)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionTrue, c.Status)
	assert.Equal(t, "DemandUnavailable", c.Reason)
	assert.Contains(t, c.Message, "connection refused")
	assert.Equal(t, int64(3), c.ObservedGeneration)
}
