package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

const ns = "operator-system"

func newMember(t *testing.T, cs *fake.Clientset, clk *clocktesting.FakeClock, identity string) *Member {
	t.Helper()
	m, err := New(Options{Leases: cs.CoordinationV1(), Namespace: ns, Group: "probes", Identity: identity, Clock: clk})
	require.NoError(t, err)
	return m
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("team-%d/proxy-%d", i%7, i)
	}
	return out
}

// TestOwnerMovesOnlyTheChangedShare: a member that joins takes keys from
// the others and moves no key between them; one that leaves hands out only
// its own; shares stay even.
func TestOwnerMovesOnlyTheChangedShare(t *testing.T) {
	ks := keys(30000)
	three := []string{"replica-a_1", "replica-b_2", "replica-c_3"}
	four := append([]string{"replica-d_4"}, three...)
	two := three[:2]
	shares := map[string]int{}
	for _, k := range ks {
		before := Owner(three, k)
		shares[before]++
		if after := Owner(four, k); after != before {
			assert.Equal(t, "replica-d_4", after, "a join moves keys only to the joiner")
		}
		if after := Owner(two, k); before != "replica-c_3" {
			assert.Equal(t, before, after, "a leave moves only the leaver's keys")
		}
	}
	for _, m := range three {
		assert.InDelta(t, len(ks)/3, shares[m], float64(len(ks))*0.03, "each of three members owns about a third: %v", shares)
	}
	assert.Empty(t, Owner(nil, "x"))
}

// TestNoKeyHasTwoOwners runs three replicas on one fake clock, each
// renewing at its own phase: a fourth joins, then one dies without
// resigning. At every instant no key is owned twice; a joiner's share is
// its own once the change has stood for the handover delay, and a dead
// replica's is taken up as soon as its Lease is seen to expire.
func TestNoKeyHasTwoOwners(t *testing.T) {
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	ctx := context.Background()
	ks := keys(600)
	type replica struct {
		m    *Member
		next time.Time
		dead bool
	}
	var replicas []*replica
	join := func(name string) {
		replicas = append(replicas, &replica{m: newMember(t, cs, clk, name), next: clk.Now()})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const tick = 250 * time.Millisecond
	// advance runs the replicas for d, checking every key at every tick.
	advance := func(d time.Duration) {
		t.Helper()
		for end := clk.Now().Add(d); clk.Now().Before(end); clk.Step(tick) {
			for _, i := range rng.Perm(len(replicas)) {
				r := replicas[i]
				if !r.dead && !clk.Now().Before(r.next) {
					r.m.step(ctx)
					r.next = clk.Now().Add(DefaultRenewInterval)
				}
			}
			for _, k := range ks {
				var owners []string
				for _, r := range replicas {
					if r.m.Owns(k) {
						owners = append(owners, r.m.Identity())
					}
				}
				require.LessOrEqual(t, len(owners), 1, "key %s owned by %v at %s", k, owners, clk.Now())
			}
		}
	}
	covered := func(want int) {
		t.Helper()
		owned := map[string]int{}
		for _, k := range ks {
			for _, r := range replicas {
				if r.m.Owns(k) {
					owned[r.m.Identity()]++
				}
			}
		}
		total := 0
		for _, n := range owned {
			total += n
		}
		require.Equal(t, len(ks), total, "every key owned once: %v", owned)
		require.Len(t, owned, want, "shared among the live replicas: %v", owned)
	}
	settle := DefaultLeaseDuration + DefaultRenewInterval + 2*DefaultRenewInterval + tick

	join("a_1")
	clk.Step(300 * time.Millisecond)
	join("b_2")
	clk.Step(700 * time.Millisecond)
	join("c_3")
	advance(settle)
	covered(3)

	join("d_4")
	advance(settle)
	covered(4)
	assert.Equal(t, []string{"a_1", "b_2", "c_3", "d_4"}, replicas[0].m.Members())

	// b dies without resigning: it owns nothing from its renew deadline,
	// and the others take its share as soon as they see its Lease expire,
	// with no handover delay: it has no owner left to wait for.
	replicas[1].dead = true
	advance(DefaultRenewDeadline)
	for _, k := range ks {
		require.False(t, replicas[1].m.Owns(k), "a replica past its renew deadline owns nothing")
	}
	advance(DefaultLeaseDuration + 2*DefaultRenewInterval + tick - DefaultRenewDeadline)
	covered(3)
	assert.Equal(t, []string{"a_1", "c_3", "d_4"}, replicas[0].m.Members())

}

// TestAReplicaThatCannotRenewOwnsNothing: the API server refuses its
// renewals; past its renew deadline it owns nothing, and owns again once a
// renewal lands.
func TestAReplicaThatCannotRenewOwnsNothing(t *testing.T) {
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	ctx := context.Background()
	m := newMember(t, cs, clk, "solo_1")
	m.step(ctx)
	clk.Step(2 * DefaultRenewInterval)
	m.step(ctx)
	require.True(t, m.Owns("team/proxy"), "a lone replica owns everything once its members settled")
	select {
	case <-m.Changes():
	default:
		t.Fatal("a settled change is announced")
	}

	refuse := true
	cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	for range int(DefaultRenewDeadline/DefaultRenewInterval) + 1 {
		clk.Step(DefaultRenewInterval)
		m.step(ctx)
	}
	assert.False(t, m.Owns("team/proxy"), "past the renew deadline without a renewal it owns nothing")
	refuse = false
	clk.Step(DefaultRenewInterval)
	m.step(ctx)
	clk.Step(2 * DefaultRenewInterval)
	m.step(ctx)
	assert.True(t, m.Owns("team/proxy"), "a renewal that lands makes it a member again")
}

// TestResigningAndCollecting: a replica that stops deletes its Lease, and
// a Lease left by a replica long dead is deleted by the others.
func TestResigningAndCollecting(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	old := metav1.NewMicroTime(clk.Now().Add(-time.Hour))
	cs := fake.NewClientset(&coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "probes-dead", Namespace: ns, Labels: map[string]string{LabelGroup: "probes"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("dead_0"), LeaseDurationSeconds: ptr.To(int32(10)), RenewTime: &old},
	})
	m := newMember(t, cs, clk, "live_1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	require.Eventually(t, func() bool {
		list, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 2 // its own, and the dead one seen for the first time
	}, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		clk.Step(DefaultRenewInterval)
		_, err := cs.CoordinationV1().Leases(ns).Get(ctx, "probes-dead", metav1.GetOptions{})
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the dead replica's Lease is collected")
	cancel()
	require.NoError(t, <-done)
	list, err := cs.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "a replica that stops deletes its Lease")
}

func TestOptionsAreChecked(t *testing.T) {
	cs := fake.NewClientset()
	_, err := New(Options{Leases: cs.CoordinationV1(), Namespace: ns, Group: "g", Identity: "i",
		LeaseDuration: 10 * time.Second, RenewDeadline: 9 * time.Second, RenewInterval: 2 * time.Second})
	require.ErrorContains(t, err, "must exceed the renew deadline")
	_, err = New(Options{Namespace: ns})
	require.ErrorContains(t, err, "needs a Leases client")
	_, err = New(Options{Leases: cs.CoordinationV1(), Namespace: ns, Group: strings.Repeat("release", 9) + "-probes", Identity: "i"})
	require.ErrorContains(t, err, "names the members' Leases by a label", "a release name too long for a label is refused at start")
}

// TestAReplicaJoinsOnceReady: a member whose replica cannot work yet holds
// no Lease (so the others keep its share), and joins once it can.
func TestAReplicaJoinsOnceReady(t *testing.T) {
	cs := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	waiting, ready := make(chan struct{}), make(chan struct{})
	m, err := New(Options{Leases: cs.CoordinationV1(), Namespace: ns, Group: "probes", Identity: "late_1", Clock: clk,
		WaitReady: func(ctx context.Context) bool {
			close(waiting)
			select {
			case <-ready:
				return true
			case <-ctx.Done():
				return false
			}
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Start(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	<-waiting
	list, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "no Lease while the replica cannot work")
	assert.False(t, m.Owns("team/proxy"))

	close(ready)
	require.Eventually(t, func() bool {
		list, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 1
	}, 5*time.Second, 10*time.Millisecond, "it joins once ready")
}
