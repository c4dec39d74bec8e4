package broker

import (
	"runtime"
	"sync"
	"weak"

	"github.com/example/egress-proxies-operator/intern"
)

// attributeSet is one proxy's attributes (spec.attributes plus the derived
// ones), shared read-only by every entry with the same ones.
type attributeSet struct {
	m map[string]string
}

// attributeSets interns the view's attribute sets. A fleet's proxies carry
// a handful of distinct sets (a pool's members, the copies of one spec),
// and a map per proxy was about half of the view's memory per proxy. The
// table holds each set weakly: a set lives while an entry holds it, and
// its row goes when it is collected.
type attributeSets struct {
	mu   sync.Mutex
	sets map[string]weak.Pointer[attributeSet]
}

// intern returns the set equal to attrs, the one already shared when there
// is one; attrs must not be changed afterwards.
func (a *attributeSets) intern(attrs map[string]string) *attributeSet {
	key := intern.Key(attrs)
	a.mu.Lock()
	defer a.mu.Unlock()
	if set := a.sets[key].Value(); set != nil {
		return set
	}
	if a.sets == nil {
		a.sets = map[string]weak.Pointer[attributeSet]{}
	}
	set := &attributeSet{m: attrs}
	a.sets[key] = weak.Make(set)
	runtime.AddCleanup(set, a.forget, key)
	return set
}

// forget drops key's row once its set is collected (and not replaced by
// a newer one since).
func (a *attributeSets) forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if wp, ok := a.sets[key]; ok && wp.Value() == nil {
		delete(a.sets, key)
	}
}
