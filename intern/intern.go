// Package intern lets the objects a fleet's cache holds share what they
// repeat. Ten thousand Proxies of a few specs carry the same namespace,
// finalizer, labels, attributes, condition reasons and messages; decoded
// from the API server, each has its own copy of every one of those
// strings and maps, about half of a cached Proxy. ProxyTransform, the
// manager's cache transform for Proxies, swaps the copies for shared ones
// as each object enters the cache.
//
// What it shares is read-only, as every object in the cache already is:
// readers get deep copies, or promise not to write (an in-place change to
// a shared map would now reach other proxies too). It imports the API
// types and libraries, nothing of the operator's own.
package intern

import (
	"slices"
	"strconv"
	"strings"
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// String is s's canonical copy: equal strings made at about the same time
// share one (Go's unique holds each canonical copy while a handle to it
// lives, so a copy made after a collection may be a new one).
func String(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// Key is m as one string, keys sorted and every key and value prefixed
// with its length: equal maps give equal strings, and no value can pass
// for a pair (values may hold any byte).
func Key(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		for _, s := range []string{k, m[k]} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}

// StringMaps hands out one shared map per distinct content. It remembers
// the most recently used maps only: a fleet has a handful of label sets
// and attribute sets, and a map no object holds any more costs a row
// until it ages out.
type StringMaps struct {
	shared *lru.Cache
}

// DefaultStringMaps is how many distinct maps a StringMaps remembers.
const DefaultStringMaps = 4096

// NewStringMaps remembers up to size maps.
func NewStringMaps(size int) *StringMaps {
	return &StringMaps{shared: lru.New(size)}
}

// Share returns the shared map equal to m: the one already shared, or,
// when there is none, a copy of m with its strings shared, which is from
// then on. The map returned must not be changed; m may be.
func (t *StringMaps) Share(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	key := Key(m)
	if shared, ok := t.shared.Get(key); ok {
		return shared.(map[string]string)
	}
	canonical := make(map[string]string, len(m))
	for k, v := range m {
		canonical[String(k)] = String(v)
	}
	t.shared.Add(key, canonical)
	return canonical
}

// ProxyTransform is the cache transform for Proxies: it drops
// managedFields, as cache.TransformStripManagedFields does for every other
// kind, and shares what a fleet's Proxies repeat through maps. It is
// idempotent, as a cache transform must be; anything but a Proxy passes
// through as the default transform would leave it.
func ProxyTransform(maps *StringMaps) toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	return func(obj any) (any, error) {
		obj, err := strip(obj)
		if p, ok := obj.(*crawlv1alpha1.Proxy); ok && err == nil {
			shareProxy(p, maps)
		}
		return obj, err
	}
}

// shareProxy swaps p's repeated strings and maps for shared ones. Per-proxy
// values (name, UID, resourceVersion, instance name) are left alone: no
// other object has them.
func shareProxy(p *crawlv1alpha1.Proxy, maps *StringMaps) {
	shareMeta(&p.ObjectMeta, maps)
	p.APIVersion, p.Kind = String(p.APIVersion), String(p.Kind)

	s := &p.Spec
	s.Mode = crawlv1alpha1.ProxyMode(String(string(s.Mode)))
	s.Provider = String(s.Provider)
	s.Attributes = maps.Share(s.Attributes)
	if pl := s.Placement; pl != nil {
		pl.Zone, pl.Region = String(pl.Zone), String(pl.Region)
	}
	if e := s.External; e != nil {
		e.Address = String(e.Address)
	}

	st := &p.Status
	st.Phase = crawlv1alpha1.ProxyPhase(String(string(st.Phase)))
	st.IP, st.Provider, st.SpecHash, st.Message = String(st.IP), String(st.Provider), String(st.SpecHash), String(st.Message)
	for i := range st.Conditions {
		shareCondition(&st.Conditions[i])
	}
	if g := st.Geo; g != nil {
		g.Country, g.City, g.ASNOrg, g.Mismatch = String(g.Country), String(g.City), String(g.ASNOrg), String(g.Mismatch)
	}
}

func shareMeta(m *metav1.ObjectMeta, maps *StringMaps) {
	m.Namespace = String(m.Namespace)
	m.Labels = maps.Share(m.Labels)
	m.Annotations = maps.Share(m.Annotations)
	for i := range m.Finalizers {
		m.Finalizers[i] = String(m.Finalizers[i])
	}
	for i := range m.OwnerReferences {
		o := &m.OwnerReferences[i]
		o.APIVersion, o.Kind, o.Name = String(o.APIVersion), String(o.Kind), String(o.Name)
		o.UID = types.UID(String(string(o.UID)))
	}
}

func shareCondition(c *metav1.Condition) {
	c.Type, c.Reason, c.Message = String(c.Type), String(c.Reason), String(c.Message)
	c.Status = metav1.ConditionStatus(String(string(c.Status)))
}
