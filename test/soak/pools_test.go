//go:build soak

package soak

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// The soak's Managed proxies are members of five ProxyPools, one per
// provider instance (two kubernetes, two gcp, one aws), recycled by age throughout
// the faults: every member is replaced a few times while everything else
// goes wrong, and nothing may be lost for it.
const (
	// poolMaxAge makes each member's instance roll over about twice in
	// the default 6-minute run.
	poolMaxAge = 150 * time.Second
	// poolZones spread the kubernetes pools' members (the pod runner
	// ignores the node constraint, as a one-node cluster with these
	// zones would honour it).
	poolZoneA, poolZoneB, poolZoneC = "zone-a", "zone-b", "zone-c"
)

// soakPool is one of the soak's ProxyPools and the share of its group's
// members it holds.
type soakPool struct {
	name, group, provider string
	zones                 []string
	placement             *crawlv1alpha1.Placement
}

var soakPools = []soakPool{
	{name: "k8s-a", group: poolKubernetes, provider: cluster.ProviderName, zones: []string{poolZoneA, poolZoneB, poolZoneC}},
	{name: "k8s-b", group: poolKubernetes, provider: kubernetesProviderB, zones: []string{poolZoneA, poolZoneB, poolZoneC}},
	{name: "gcp-a", group: poolVM, provider: gcpProvider, placement: &crawlv1alpha1.Placement{Zone: gcpZone, MachineType: "e2-small"}},
	{name: "gcp-b", group: poolVM, provider: gcpProviderB, placement: &crawlv1alpha1.Placement{Zone: gcpZone, MachineType: "e2-small"}},
	// Spot instances over two zones: the chaos interrupts them.
	{name: "aws-a", group: poolVM, provider: awsProvider, zones: []string{awsZoneA, awsZoneB},
		placement: &crawlv1alpha1.Placement{MachineType: "t3.micro", Parameters: map[string]string{"marketType": "spot"}}},
}

// newPools splits each Managed group's size over its pools.
func newPools(sizes map[string]int) []*crawlv1alpha1.ProxyPool {
	perGroup := map[string]int{}
	for _, sp := range soakPools {
		perGroup[sp.group]++
	}
	seen := map[string]int{}
	var out []*crawlv1alpha1.ProxyPool
	for _, sp := range soakPools {
		n, k := sizes[sp.group], perGroup[sp.group]
		replicas := int32(n / k)
		if seen[sp.group] < n%k {
			replicas++
		}
		seen[sp.group]++
		spec := crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: sp.provider, Port: crawlv1alpha1.DefaultPort,
			Attributes: map[string]string{poolKey: sp.group}, Placement: sp.placement.DeepCopy()}
		surge, unavailable := intstr.FromString("25%"), intstr.FromString("10%")
		out = append(out, &crawlv1alpha1.ProxyPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sp.name},
			Spec: crawlv1alpha1.ProxyPoolSpec{
				Replicas: &replicas, Zones: sp.zones,
				MaxAge:   &metav1.Duration{Duration: poolMaxAge},
				Strategy: crawlv1alpha1.PoolStrategy{MaxSurge: &surge, MaxUnavailable: &unavailable},
				Template: crawlv1alpha1.ProxyTemplate{Spec: spec},
			},
		})
	}
	return out
}

// stopRecycling takes maxAge off every pool once the faults end, so the
// checks judge a fleet at rest rather than one mid-roll.
func (w *world) stopRecycling(ctx context.Context) error {
	var pools crawlv1alpha1.ProxyPoolList
	if err := w.cluster.Env.Client.List(ctx, &pools, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing pools: %w", err)
	}
	for i := range pools.Items {
		p := &pools.Items[i]
		patch := client.MergeFrom(p.DeepCopy())
		p.Spec.MaxAge = nil
		if err := w.cluster.Env.Client.Patch(ctx, p, patch); err != nil {
			return fmt.Errorf("turning recycling off on ProxyPool %s: %w", p.Name, err)
		}
	}
	return nil
}

// poolProblems lists every pool that does not have exactly its replicas,
// all available and of its current template, with its zones at most one
// apart, and that has not observed its last change.
func (w *world) poolProblems(ctx context.Context) []string {
	var pools crawlv1alpha1.ProxyPoolList
	if err := w.cluster.Env.Client.List(ctx, &pools, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}
	}
	if len(pools.Items) != len(soakPools) {
		return []string{fmt.Sprintf("%d ProxyPools, want %d", len(pools.Items), len(soakPools))}
	}
	var problems []string
	for _, p := range pools.Items {
		var members crawlv1alpha1.ProxyList
		if err := w.cluster.Env.Client.List(ctx, &members, client.InNamespace(namespace), client.MatchingLabels{crawlv1alpha1.LabelPool: p.Name}); err != nil {
			return []string{err.Error()}
		}
		want, s := *p.Spec.Replicas, p.Status
		perZone := map[string]int{}
		for _, m := range members.Items {
			if m.Spec.Placement != nil {
				perZone[m.Spec.Placement.Zone]++
			}
		}
		switch {
		case s.ObservedGeneration != p.Generation:
			problems = append(problems, fmt.Sprintf("ProxyPool %s: generation %d not observed (at %d)", p.Name, p.Generation, s.ObservedGeneration))
		case int32(len(members.Items)) != want:
			problems = append(problems, fmt.Sprintf("ProxyPool %s: %d members, want %d", p.Name, len(members.Items), want))
		case s.AvailableReplicas != want || s.UpdatedReplicas != want:
			problems = append(problems, fmt.Sprintf("ProxyPool %s: %d available, %d updated, want %d", p.Name, s.AvailableReplicas, s.UpdatedReplicas, want))
		case !meta.IsStatusConditionTrue(s.Conditions, crawlv1alpha1.ConditionAvailable):
			problems = append(problems, fmt.Sprintf("ProxyPool %s: not Available", p.Name))
		case len(p.Spec.Zones) > 0 && spread(perZone, p.Spec.Zones) > 1:
			problems = append(problems, fmt.Sprintf("ProxyPool %s: zones %v are more than one apart", p.Name, perZone))
		}
	}
	slices.Sort(problems)
	return problems
}

// spread is how far apart the most and the fewest members per zone are.
func spread(perZone map[string]int, zones []string) int {
	var counts []int
	for _, z := range zones {
		counts = append(counts, perZone[z])
	}
	return slices.Max(counts) - slices.Min(counts)
}

// changeTemplate changes a pool's template so that it rolls: the port of
// a pod pool, the machine type of a VM pool. A pool still rolling from the
// last change is left alone, so rolls follow each other rather than pile
// up.
func (c *chaos) changeTemplate(ctx context.Context, poolName string) {
	cl := c.w.cluster.Env.Client
	var p crawlv1alpha1.ProxyPool
	if err := cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: poolName}, &p); err != nil {
		c.fail("reading ProxyPool %s: %v", poolName, err)
		return
	}
	if p.Status.ObservedGeneration != p.Generation || p.Status.UpdatedReplicas < *p.Spec.Replicas {
		return
	}
	patch := client.MergeFrom(p.DeepCopy())
	spec := &p.Spec.Template.Spec
	if spec.Placement != nil {
		spec.Placement.MachineType = map[string]string{"e2-small": "e2-medium", "e2-medium": "e2-small", "t3.micro": "t3.small", "t3.small": "t3.micro"}[spec.Placement.MachineType]
	} else {
		spec.Port = map[int32]int32{crawlv1alpha1.DefaultPort: 3129, 3129: crawlv1alpha1.DefaultPort}[spec.Port]
	}
	if err := cl.Patch(ctx, &p, patch); err != nil {
		c.fail("changing ProxyPool %s's template: %v", poolName, err)
		return
	}
	c.count("pool template changed (the pool rolls)")
}
