package intern

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sigsjson "sigs.k8s.io/json"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// sameMap says whether a and b are one map, not two equal ones.
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// sameBytes says whether a and b are one string in memory.
func sameBytes(a, b string) bool { return a == b && unsafe.StringData(a) == unsafe.StringData(b) }

func TestKeyIsUnambiguous(t *testing.T) {
	assert.Equal(t, Key(map[string]string{"geo": "eu", "tier": "a"}), Key(map[string]string{"tier": "a", "geo": "eu"}), "order does not matter")
	assert.NotEqual(t, Key(map[string]string{"geo": "eu"}), Key(map[string]string{"geo": "us"}))
	// A value that spells out more pairs is not confused with them.
	assert.NotEqual(t, Key(map[string]string{"k": "1:v1:x0:"}), Key(map[string]string{"k": "v", "x": ""}))
	assert.NotEqual(t, Key(map[string]string{"": "a"}), Key(map[string]string{"a": ""}))
}

func TestShareStringMaps(t *testing.T) {
	maps := NewStringMaps(2)
	a := maps.Share(map[string]string{"geo": "eu", "tier": "a"})
	b := maps.Share(map[string]string{"tier": "a", "geo": "eu"})
	c := maps.Share(map[string]string{"geo": "us", "tier": "a"})
	assert.True(t, sameMap(a, b), "equal maps share one")
	assert.False(t, sameMap(a, c))
	assert.Equal(t, map[string]string{"geo": "us", "tier": "a"}, c, "content is kept")
	assert.Nil(t, maps.Share(nil), "nil stays nil: a cached object's absent labels are not made present")
	assert.NotNil(t, maps.Share(map[string]string{}), "empty stays empty, not nil")

	// Only size maps are remembered: a third pushes out the oldest, which is
	// then shared anew.
	maps.Share(map[string]string{"geo": "ap"})
	d := maps.Share(map[string]string{"geo": "eu", "tier": "a"})
	assert.Equal(t, a, d)
	assert.False(t, sameMap(a, d), "a map past the table's size is no longer shared")
}

// decoded is p as the cache gets it: decoded from JSON, every string and
// map its own.
func decoded(t *testing.T, p *crawlv1alpha1.Proxy) *crawlv1alpha1.Proxy {
	t.Helper()
	data, err := json.Marshal(p)
	require.NoError(t, err)
	var out crawlv1alpha1.Proxy
	require.NoError(t, sigsjson.UnmarshalCaseSensitivePreserveInts(data, &out))
	return &out
}

func fleetMember(i int) *crawlv1alpha1.Proxy {
	now := metav1.Now()
	return &crawlv1alpha1.Proxy{
		TypeMeta: metav1.TypeMeta{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "Proxy"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "crawl", Name: fmt.Sprintf("eu-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i)), ResourceVersion: fmt.Sprint(100 + i),
			Labels:          map[string]string{crawlv1alpha1.LabelPool: "eu"},
			Finalizers:      []string{"crawl.example.com/instance"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "eu", UID: "pool-uid"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "operator", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Attributes: map[string]string{"geo": "eu"},
			Placement: &crawlv1alpha1.Placement{Zone: "eu-a"}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: fmt.Sprintf("10.0.0.%d", i), Port: 3128, InstanceName: fmt.Sprintf("eu-%d-x", i),
			Provider: "kind-local", SpecHash: "abc123", Conditions: []metav1.Condition{
				{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded", Message: "probe passed", LastTransitionTime: now},
			}},
	}
}

func TestProxyTransform(t *testing.T) {
	transform := ProxyTransform(NewStringMaps(DefaultStringMaps))
	var cached []*crawlv1alpha1.Proxy
	for i := range 2 {
		want := decoded(t, fleetMember(i))
		obj, err := transform(want.DeepCopy())
		require.NoError(t, err)
		p := obj.(*crawlv1alpha1.Proxy)
		want.ManagedFields = nil
		assert.Equal(t, want, p, "what the cache holds reads as the object did, without managedFields")
		cached = append(cached, p)
	}
	a, b := cached[0], cached[1]
	assert.True(t, sameMap(a.Spec.Attributes, b.Spec.Attributes), "one fleet, one attributes map")
	assert.True(t, sameMap(a.Labels, b.Labels), "one fleet, one labels map")
	for what, pair := range map[string][2]string{
		"namespace":         {a.Namespace, b.Namespace},
		"finalizer":         {a.Finalizers[0], b.Finalizers[0]},
		"owner UID":         {string(a.OwnerReferences[0].UID), string(b.OwnerReferences[0].UID)},
		"provider":          {a.Spec.Provider, b.Spec.Provider},
		"zone":              {a.Spec.Placement.Zone, b.Spec.Placement.Zone},
		"spec hash":         {a.Status.SpecHash, b.Status.SpecHash},
		"condition reason":  {a.Status.Conditions[0].Reason, b.Status.Conditions[0].Reason},
		"condition message": {a.Status.Conditions[0].Message, b.Status.Conditions[0].Message},
	} {
		assert.True(t, sameBytes(pair[0], pair[1]), "%s is one string across the fleet", what)
	}
	assert.NotEqual(t, a.Status.IP, b.Status.IP)

	// Idempotent, as a cache transform must be.
	again, err := transform(a.DeepCopy())
	require.NoError(t, err)
	assert.Equal(t, a, again)
	runtime.KeepAlive(cached)
}

func TestProxyTransformPassesOtherObjects(t *testing.T) {
	transform := ProxyTransform(NewStringMaps(DefaultStringMaps))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"a": "b"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	obj, err := transform(secret)
	require.NoError(t, err)
	assert.Same(t, secret, obj)
	assert.Nil(t, secret.ManagedFields, "managedFields go, as the default transform drops them")
	assert.Equal(t, map[string]string{"a": "b"}, secret.Labels)
}

// BenchmarkCachedProxy is the memory one cached Proxy of a fleet takes,
// shared through ProxyTransform beside decoded as the API server sent it
// (managedFields stripped on both sides).
func BenchmarkCachedProxy(b *testing.B) {
	const fleet = 10_000
	heldPer := func(share bool) float64 {
		transform := ProxyTransform(NewStringMaps(DefaultStringMaps))
		var raw [][]byte
		for i := range fleet {
			p := fleetMember(i)
			p.ManagedFields = nil
			data, err := json.Marshal(p)
			if err != nil {
				b.Fatal(err)
			}
			raw = append(raw, data)
		}
		before := heapInUse()
		held := make([]*crawlv1alpha1.Proxy, fleet)
		for i, data := range raw {
			var p crawlv1alpha1.Proxy
			if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &p); err != nil {
				b.Fatal(err)
			}
			held[i] = &p
			if share {
				if _, err := transform(&p); err != nil {
					b.Fatal(err)
				}
			}
		}
		after := heapInUse()
		runtime.KeepAlive(held)
		runtime.KeepAlive(raw)
		return float64(after-before) / fleet
	}
	var shared, bare float64
	for b.Loop() {
		shared += heldPer(true)
		bare += heldPer(false)
	}
	b.ReportMetric(shared/float64(b.N), "operator_B/proxy")
	b.ReportMetric(bare/float64(b.N), "bare_B/proxy")
	b.ReportMetric(0, "ns/op")
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
