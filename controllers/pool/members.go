package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// A pool's members: as decide sees them, and as the controller makes them
// from the template.

// inputOf turns a pool and its members into decide's input.
func inputOf(pool *crawlv1alpha1.ProxyPool, replicas int32, members []crawlv1alpha1.Proxy, hash string, now time.Time) Input {
	surge, unavailable := budget(pool.Spec.Strategy, int(replicas))
	in := Input{
		Replicas: int(replicas), Zones: pool.Spec.Zones, MaxSurge: surge, MaxUnavailable: unavailable,
		JitterPercent: int(pool.Spec.MaxAgeJitterPercent), MinReady: time.Duration(pool.Spec.MinReadySeconds) * time.Second, Now: now,
	}
	if pool.Spec.MaxAge != nil {
		in.MaxAge = pool.Spec.MaxAge.Duration
	}
	for _, p := range pool.Spec.Providers {
		in.Providers = append(in.Providers, ProviderShare{Name: p.Name, Weight: int(ptr.Deref(p.Weight, 1)), Zones: p.Zones})
	}
	for i := range members {
		m := memberOf(&members[i], hash)
		if len(in.Providers) > 0 {
			m.Zone = SlotOf(members[i].Spec.Provider, m.Zone)
		}
		in.Members = append(in.Members, m)
	}
	return in
}

// budget resolves maxSurge (rounded up) and maxUnavailable (rounded down)
// against replicas, as a Deployment does: when both come to zero, one
// member may be unavailable, or nothing could ever be replaced.
func budget(s crawlv1alpha1.PoolStrategy, replicas int) (surge, unavailable int) {
	surgeV, unavailableV := ptr.Deref(s.MaxSurge, DefaultMaxSurge), ptr.Deref(s.MaxUnavailable, DefaultMaxUnavailable)
	surge, err := intstr.GetScaledValueFromIntOrPercent(&surgeV, replicas, true)
	if err != nil {
		surge = 1
	}
	unavailable, err = intstr.GetScaledValueFromIntOrPercent(&unavailableV, replicas, false)
	if err != nil {
		unavailable = 0
	}
	if surge == 0 && unavailable == 0 {
		unavailable = 1
	}
	return surge, unavailable
}

// memberOf is what decide needs of one member.
func memberOf(p *crawlv1alpha1.Proxy, hash string) Member {
	m := Member{
		Name: p.Name, Zone: p.Labels[crawlv1alpha1.LabelZone], Updated: p.Labels[crawlv1alpha1.LabelPoolTemplateHash] == hash,
		Created: p.CreationTimestamp.Time, Deleting: !p.DeletionTimestamp.IsZero(), Jitter: jitterOf(p.UID),
	}
	if p.IsReady() {
		// Ready since its stored Ready condition says, or, while that
		// condition follows its parts (one write later), since its verdict.
		m.Ready, m.ReadySince = true, p.RecordedHealth().LastTransitionTime.Time
		if ready := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionReady); ready != nil && ready.Status == metav1.ConditionTrue {
			m.ReadySince = ready.LastTransitionTime.Time
		}
	}
	prov := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
	m.Sick = prov != nil && prov.Reason == crawlv1alpha1.ReasonUnhealthyTooLong && p.Status.Phase == crawlv1alpha1.PhaseReady
	m.Banned = prov != nil && prov.Reason == crawlv1alpha1.ReasonBanned && p.Status.Phase == crawlv1alpha1.PhaseReady
	m.NoRoom = prov != nil && p.Status.Phase == crawlv1alpha1.PhaseFailed &&
		(prov.Reason == crawlv1alpha1.ReasonNoCapacity || prov.Reason == crawlv1alpha1.ReasonQuotaExceeded)
	m.SpotRefused = m.NoRoom && prov.Reason == crawlv1alpha1.ReasonNoCapacity && p.Spec.Placement.IsSpot()
	return m
}

// jitterOf is a member's fixed share of the age jitter, in [0, 1), from
// its UID: the same on every pass and after a restart.
func jitterOf(uid types.UID) float64 {
	sum := sha256.Sum256([]byte(uid))
	return float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53)
}

// TemplateHash is a short hash of a pool's template: every member made
// from it carries it in its LabelPoolTemplateHash label.
func TemplateHash(t *crawlv1alpha1.ProxyTemplate) string {
	data, err := json.Marshal(t)
	if err != nil {
		// A template that came from the API always marshals.
		panic(fmt.Sprintf("marshalling a ProxyPool template: %v", err))
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:10]
}

// newMember is a Proxy made from the pool's template for one slot (a zone,
// or in a pool across providers a provider and zone), named from the
// pool, labelled with it and controlled by it; a Managed one carries the
// instance-cleanup finalizer from its creation.
func newMember(pool *crawlv1alpha1.ProxyPool, slot, hash string, scheme *runtime.Scheme) (*crawlv1alpha1.Proxy, error) {
	t := pool.Spec.Template
	zone, provider := slot, ""
	if len(pool.Spec.Providers) > 0 {
		provider, zone, _ = strings.Cut(slot, "/")
	}
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{
			Name:        pool.Name + "-" + utilrand.String(5),
			Namespace:   pool.Namespace,
			Labels:      map[string]string{},
			Annotations: t.Metadata.Annotations,
		},
		Spec: *t.Spec.DeepCopy(),
	}
	for k, v := range t.Metadata.Labels {
		p.Labels[k] = v
	}
	p.Labels[crawlv1alpha1.LabelPool] = pool.Name
	p.Labels[crawlv1alpha1.LabelPoolTemplateHash] = hash
	if provider != "" {
		p.Spec.Provider = provider
	}
	if zone != "" {
		p.Labels[crawlv1alpha1.LabelZone] = zone
		if p.Spec.Placement == nil {
			p.Spec.Placement = &crawlv1alpha1.Placement{}
		}
		p.Spec.Placement.Zone = zone
	}
	if p.Spec.Mode == crawlv1alpha1.ModeManaged {
		// Born with the finalizer the Proxy reconciler would add as its
		// first write: one write less per member, and the member's first
		// pass provisions. The reconciler removes it as for any Proxy.
		controllerutil.AddFinalizer(p, crawlv1alpha1.Finalizer)
	}
	if err := controllerutil.SetControllerReference(pool, p, scheme); err != nil {
		return nil, fmt.Errorf("owning member %s by ProxyPool %s/%s: %w", p.Name, pool.Namespace, pool.Name, err)
	}
	return p, nil
}

// Selector is the label selector of a pool's members, as the scale
// subresource reports it.
func Selector(pool *crawlv1alpha1.ProxyPool) string {
	return labels.SelectorFromSet(labels.Set{crawlv1alpha1.LabelPool: pool.Name}).String()
}
