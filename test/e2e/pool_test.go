package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// poolLongWait covers a pool rolling every member, one successor at a time.
const poolLongWait = 3 * time.Minute

func newPool(ns, name string, replicas int32, zones ...string) *crawlv1alpha1.ProxyPool {
	return &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr(replicas),
			Zones:    zones,
			Strategy: crawlv1alpha1.PoolStrategy{MaxSurge: ptr(intstr.FromInt32(1)), MaxUnavailable: ptr(intstr.FromInt32(0))},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: cluster.ProviderName, Port: crawlv1alpha1.DefaultPort,
				Attributes: map[string]string{"suite": ns},
			}},
		},
	}
}

// members lists the pool's Proxies, as a user would with the label.
func members(t *testing.T, pool *crawlv1alpha1.ProxyPool) []crawlv1alpha1.Proxy {
	t.Helper()
	var list crawlv1alpha1.ProxyList
	require.NoError(t, world.cluster.Env.Client.List(context.Background(), &list, client.InNamespace(pool.Namespace),
		client.MatchingLabels{crawlv1alpha1.LabelPool: pool.Name}))
	return list.Items
}

// serving counts the members that are Ready and not being deleted: what
// crawlers can lease.
func serving(ms []crawlv1alpha1.Proxy) int {
	n := 0
	for _, m := range ms {
		if m.DeletionTimestamp.IsZero() && meta.IsStatusConditionTrue(m.Status.Conditions, crawlv1alpha1.ConditionReady) {
			n++
		}
	}
	return n
}

func perZone(ms []crawlv1alpha1.Proxy) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		if m.DeletionTimestamp.IsZero() {
			out[m.Spec.Placement.Zone]++
		}
	}
	return out
}

// waitPool waits until the pool's status and its members satisfy cond.
func waitPool(t *testing.T, pool *crawlv1alpha1.ProxyPool, within time.Duration, what string, cond func(*crawlv1alpha1.ProxyPool, []crawlv1alpha1.Proxy) bool) *crawlv1alpha1.ProxyPool {
	t.Helper()
	var last crawlv1alpha1.ProxyPool
	require.Eventually(t, func() bool {
		if err := world.cluster.Env.Client.Get(context.Background(), client.ObjectKeyFromObject(pool), &last); err != nil {
			return false
		}
		return cond(&last, members(t, pool))
	}, within, poll, "ProxyPool %s/%s: %s never happened; last status %+v", pool.Namespace, pool.Name, what, &last.Status)
	return &last
}

// settledAt: the pool has n members, every one updated and available.
func settledAt(n int32) func(*crawlv1alpha1.ProxyPool, []crawlv1alpha1.Proxy) bool {
	return func(p *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
		return p.Status.ObservedGeneration == p.Generation && p.Status.AvailableReplicas == n && p.Status.UpdatedReplicas == n &&
			p.Status.Replicas == n && len(ms) == int(n) && serving(ms) == int(n)
	}
}

// kubectl runs the control plane's kubectl against the cluster.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	out, err := exec.Command(bin, append([]string{"--kubeconfig", world.cluster.Kubeconfig}, args...)...).CombinedOutput()
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// floorSampler lists the pool's members every 200ms and keeps the fewest
// serving it saw.
type floorSampler struct {
	mu      sync.Mutex
	fewest  int
	samples int
	stop    chan struct{}
	done    chan struct{}
}

func sampleFloor(pool *crawlv1alpha1.ProxyPool) *floorSampler {
	return sampleMembersFloor(listMembers(world.cluster.Env.Client, pool))
}

// listMembers lists the pool's members through c, for a sampler.
func listMembers(c client.Client, pool *crawlv1alpha1.ProxyPool) func() ([]crawlv1alpha1.Proxy, error) {
	return func() ([]crawlv1alpha1.Proxy, error) {
		var list crawlv1alpha1.ProxyList
		err := c.List(context.Background(), &list, client.InNamespace(pool.Namespace), client.MatchingLabels{crawlv1alpha1.LabelPool: pool.Name})
		return list.Items, err
	}
}

// sampleMembersFloor lists the members every 200ms (a list that fails is
// skipped) and keeps the fewest serving.
func sampleMembersFloor(list func() ([]crawlv1alpha1.Proxy, error)) *floorSampler {
	s := &floorSampler{fewest: 1 << 30, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		ticker := time.NewTicker(200 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-ticker.C:
			}
			ms, err := list()
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.fewest, s.samples = min(s.fewest, serving(ms)), s.samples+1
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *floorSampler) finish() (fewest, samples int) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fewest, s.samples
}

func names(ms []crawlv1alpha1.Proxy) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		out[m.Name] = true
	}
	return out
}

// testPool drives a pool of real Squid pods through its life: spread,
// kubectl scale, age recycling under a sampler, a template roll, leasing
// by pool name, and deletion.
func testPool(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	pool := newPool(ns, "fleet", 6, "zone-a", "zone-b", "zone-c")
	require.NoError(t, c.Create(ctx, pool))

	waitPool(t, pool, poolLongWait, "6 members available", settledAt(6))
	ms := members(t, pool)
	assert.Equal(t, map[string]int{"zone-a": 2, "zone-b": 2, "zone-c": 2}, perZone(ms), "spread 2/2/2")
	for _, m := range ms {
		assert.True(t, strings.HasPrefix(m.Name, "fleet-"), "named from the pool: %s", m.Name)
		ref := metav1.GetControllerOf(&m)
		require.NotNil(t, ref, "%s is controlled by its pool", m.Name)
		assert.Equal(t, "ProxyPool", ref.Kind)
	}
	for _, pod := range proxyPods(t, ns) {
		zone := pod.Spec.NodeSelector[corev1.LabelTopologyZone]
		assert.Contains(t, []string{"zone-a", "zone-b", "zone-c"}, zone, "pod %s is pinned to its member's zone", pod.Name)
	}
	columns := kubectl(t, "get", "pxp", "-n", ns)
	for _, col := range []string{"NAME", "PROVIDER", "DESIRED", "READY", "AVAILABLE", "AGE"} {
		assert.Contains(t, columns, col, "printer columns")
	}
	// The pods look as they would on a real cluster: every container ready.
	podLines := strings.Split(strings.TrimSpace(kubectl(t, "get", "pods", "-n", ns, "--no-headers")), "\n")
	assert.Len(t, podLines, 6, "one pod per member")
	for _, line := range podLines {
		assert.Regexp(t, `^\S+\s+1/1\s+Running\s`, line, "kubectl get pods")
	}

	t.Run("lease by pool name", func(t *testing.T) {
		lease := api(t, "POST", "/v1/leases", `{"selector":{"pool":"fleet"},"ttlSeconds":60}`)
		require.Equal(t, http.StatusCreated, lease.status)
		assert.True(t, strings.HasPrefix(leaseProxy(lease), ns+"/fleet-"), "leased a member: %s", leaseProxy(lease))
		assert.Equal(t, http.StatusNoContent, api(t, "DELETE", "/v1/leases/"+lease.body["leaseID"].(string), "").status)
	})

	t.Run("kubectl scale", func(t *testing.T) {
		kubectl(t, "scale", "pxp/fleet", "-n", ns, "--replicas=9")
		waitPool(t, pool, poolLongWait, "9 members available", settledAt(9))
		assert.Equal(t, map[string]int{"zone-a": 3, "zone-b": 3, "zone-c": 3}, perZone(members(t, pool)), "spread 3/3/3")
		scale := kubectl(t, "get", "--raw", fmt.Sprintf("/apis/crawl.example.com/v1alpha1/namespaces/%s/proxypools/fleet/scale", ns))
		assert.Contains(t, scale, `"selector":"crawl.example.com/pool=fleet"`, "the scale subresource reports the members' selector")
	})

	t.Run("age recycling keeps the floor", func(t *testing.T) {
		old := names(members(t, pool))
		sampler := sampleFloor(pool)
		patchPool(t, pool, func(p *crawlv1alpha1.ProxyPool) {
			p.Spec.MaxAge = &metav1.Duration{Duration: 30 * time.Second}
			p.Spec.MaxAgeJitterPercent = 0
		})
		waitPool(t, pool, poolLongWait, "every member recycled", func(_ *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
			for _, m := range ms {
				if old[m.Name] {
					return false
				}
			}
			return serving(ms) >= 9
		})
		// Stop the recycling before its second round.
		patchPool(t, pool, func(p *crawlv1alpha1.ProxyPool) { p.Spec.MaxAge = nil })
		fewest, samples := sampler.finish()
		t.Logf("recycled 9 members; %d samples, never fewer than %d serving", samples, fewest)
		assert.Greater(t, samples, 20, "the sampler ran")
		assert.GreaterOrEqual(t, fewest, 9, "never below replicas - maxUnavailable serving members while recycling")
		waitPool(t, pool, poolLongWait, "settled again", settledAt(9))
		assert.Equal(t, map[string]int{"zone-a": 3, "zone-b": 3, "zone-c": 3}, perZone(members(t, pool)), "spread kept")
		assert.True(t, hasEvent(t, ns, "fleet", "MemberRetired"), "an Event per retired member")
	})

	t.Run("a template change rolls", func(t *testing.T) {
		before := waitPool(t, pool, waitFor, "settled", settledAt(9)).Status.TemplateHash
		sampler := sampleFloor(pool)
		patchPool(t, pool, func(p *crawlv1alpha1.ProxyPool) { p.Spec.Template.Spec.Attributes["tier"] = "rolled" })
		after := waitPool(t, pool, poolLongWait, "rolled to the new template", func(p *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
			if !settledAt(9)(p, ms) || p.Status.TemplateHash == before {
				return false
			}
			for _, m := range ms {
				if m.Spec.Attributes["tier"] != "rolled" {
					return false
				}
			}
			return true
		})
		fewest, _ := sampler.finish()
		assert.GreaterOrEqual(t, fewest, 9, "the roll kept the floor")
		assert.True(t, meta.IsStatusConditionTrue(after.Status.Conditions, crawlv1alpha1.ConditionAvailable))
	})

	t.Run("deleting a member replaces it", func(t *testing.T) {
		victim := members(t, pool)[0]
		require.NoError(t, c.Delete(ctx, &victim))
		waitPool(t, pool, poolLongWait, "back to 9 without the deleted member", func(p *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
			return settledAt(9)(p, ms) && !names(ms)[victim.Name]
		})
	})

	t.Run("deleting the pool leaves nothing behind", func(t *testing.T) {
		require.NoError(t, c.Delete(ctx, pool))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(pool), &crawlv1alpha1.ProxyPool{})) &&
				len(members(t, pool)) == 0 && len(proxyPods(t, ns)) == 0
		}, poolLongWait, poll, "the pool, its members and their pods are gone")
	})
}

// testPoolAutoscaling: leases on a pool's members grow it at once; once
// released, it shrinks after the scale-down delay.
func testPoolAutoscaling(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	pool := newPool(ns, "elastic", 1)
	pool.Spec.Autoscaling = &crawlv1alpha1.PoolAutoscaling{
		MinReplicas: 1, MaxReplicas: 4, TargetLeasesPerMember: 1, ScaleDownDelay: &metav1.Duration{Duration: 5 * time.Second},
	}
	require.NoError(t, c.Create(ctx, pool))
	waitPool(t, pool, poolLongWait, "1 member available", settledAt(1))

	var leases []string
	for range 3 {
		lease := api(t, "POST", "/v1/leases", `{"selector":{"pool":"elastic"},"ttlSeconds":300}`)
		require.Equal(t, http.StatusCreated, lease.status)
		leases = append(leases, lease.body["leaseID"].(string))
	}
	grown := waitPool(t, pool, poolLongWait, "grown to 3 for 3 leases", func(p *crawlv1alpha1.ProxyPool, ms []crawlv1alpha1.Proxy) bool {
		return *p.Spec.Replicas >= 3 && settledAt(*p.Spec.Replicas)(p, ms)
	})
	assert.Equal(t, int32(3), grown.Status.Autoscaling.ActiveLeases)
	assert.True(t, hasEvent(t, ns, "elastic", "Autoscaled"))
	// The autoscaler writes spec.replicas as an HPA does, through the
	// scale subresource: the operator owns no field of the pool's spec (a
	// merge patch of the pool would own spec.replicas), so a GitOps tool
	// applying the spec without replicas conflicts with nothing.
	for _, mf := range grown.ManagedFields {
		if strings.HasPrefix(mf.Manager, "egress-proxies-operator") && mf.FieldsV1 != nil {
			assert.NotContains(t, mf.FieldsV1.GetRawString(), `"f:spec"`, "%s owns a field of the pool's spec", mf.Manager)
		}
	}

	for _, id := range leases {
		require.Equal(t, http.StatusNoContent, api(t, "DELETE", "/v1/leases/"+id, "").status)
	}
	released := time.Now()
	shrunk := waitPool(t, pool, poolLongWait, "shrunk back to 1", settledAt(1))
	// The delay runs from the last autoscale pass that saw the leases
	// (--pool-autoscale-interval=1s here), which may precede their release
	// by up to one interval.
	assert.GreaterOrEqual(t, time.Since(released), 5*time.Second-time.Second, "not before the scale-down delay")
	limited := meta.FindStatusCondition(shrunk.Status.Conditions, crawlv1alpha1.ConditionScalingLimited)
	require.NotNil(t, limited)
	assert.Equal(t, "TooFewReplicas", limited.Reason, "no demand: held at minReplicas, and it says so")

	require.NoError(t, c.Delete(ctx, pool))
	require.Eventually(t, func() bool { return len(members(t, pool)) == 0 && len(proxyPods(t, ns)) == 0 }, poolLongWait, poll)
}

func patchPool(t *testing.T, pool *crawlv1alpha1.ProxyPool, edit func(*crawlv1alpha1.ProxyPool)) {
	t.Helper()
	c := world.cluster.Env.Client
	require.Eventually(t, func() bool {
		var p crawlv1alpha1.ProxyPool
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(pool), &p); err != nil {
			return false
		}
		edit(&p)
		return c.Update(context.Background(), &p) == nil
	}, 10*time.Second, poll, "updating ProxyPool %s", pool.Name)
}
