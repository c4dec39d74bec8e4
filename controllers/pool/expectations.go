package pool

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// expectationTimeout bounds how long a pass waits for the cache to show
// its writes; past it the pool acts on what it sees (a lost watch event
// must not stall it).
const expectationTimeout = 30 * time.Second

// expectationRecheck is how soon a pass waiting on the cache looks again.
const expectationRecheck = time.Second

// expectations are the members a pass created or deleted that the cache
// does not show yet, per pool: a ReplicaSet's expectations. Without them a
// pass right after a create would see one member too few and create
// again. They live in memory only: after a restart the cache starts from a
// fresh List, which shows every earlier write.
type expectations struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*expected
}

type expected struct {
	creates, deletes sets.Set[string]
	since            time.Time
}

func (e *expectations) entry(key types.NamespacedName, now time.Time) *expected {
	if e.m == nil {
		e.m = map[types.NamespacedName]*expected{}
	}
	x, ok := e.m[key]
	if !ok {
		x = &expected{creates: sets.New[string](), deletes: sets.New[string]()}
		e.m[key] = x
	}
	x.since = now
	return x
}

func (e *expectations) create(key types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.entry(key, now).creates.Insert(name)
}

func (e *expectations) delete(key types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.entry(key, now).deletes.Insert(name)
}

func (e *expectations) forget(key types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, key)
}

// pending says whether the pool's last writes are still missing from
// members (as listed from the cache), and how soon to look again.
func (e *expectations) pending(key types.NamespacedName, members []crawlv1alpha1.Proxy, now time.Time) (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.m[key]
	if !ok {
		return 0, false
	}
	for _, m := range members {
		x.creates.Delete(m.Name)
		if !m.DeletionTimestamp.IsZero() {
			x.deletes.Delete(m.Name)
		}
	}
	present := sets.New[string]()
	for _, m := range members {
		present.Insert(m.Name)
	}
	x.deletes = x.deletes.Intersection(present)
	if (x.creates.Len() == 0 && x.deletes.Len() == 0) || now.Sub(x.since) > expectationTimeout {
		delete(e.m, key)
		return 0, false
	}
	return expectationRecheck, true
}
