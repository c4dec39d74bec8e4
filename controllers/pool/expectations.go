package pool

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/controllers/cachelag"
)

// The members a pass created or deleted that the cache does not show yet
// are a ReplicaSet's expectations: without them a pass right after a create
// would see one member too few and create again. They are writes the
// operator's one cache-lag tracker remembers, with the pool as payload;
// after a restart the cache starts from a fresh List, which shows every
// earlier write.

// expectationRecheck is how soon a pass that waits on the cache looks
// again when no event comes first. A pass lists every member, and the
// members' own watch events bring the pass that finds them, so this is
// only the fallback, not cachelag.Recheck's 50ms.
const expectationRecheck = time.Second

// memberOfPool is the payload of a member's write: its pool.
type memberOfPool types.NamespacedName

// tracker is the pool controller's cache-lag tracker, made on first use.
func (r *Reconciler) tracker() *cachelag.Tracker {
	r.lagOnce.Do(func() { r.lag = cachelag.New("pool", r.Clock, 0) })
	return r.lag
}

// memberKey is the tracker's key of member name of pool.
func memberKey(pool types.NamespacedName, name string) cachelag.Key {
	return cachelag.Key{Kind: "Proxy", NamespacedName: types.NamespacedName{Namespace: pool.Namespace, Name: name}}
}

// expectCreate notes that pool is creating member name.
func (r *Reconciler) expectCreate(pool types.NamespacedName, name string) {
	r.tracker().Wrote(memberKey(pool, name), "", memberOfPool(pool))
}

// expectDelete notes that pool is deleting member m.
func (r *Reconciler) expectDelete(pool types.NamespacedName, m *crawlv1alpha1.Proxy) {
	r.tracker().Wrote(memberKey(pool, m.Name), m.ResourceVersion, memberOfPool(pool))
}

// forgetMember drops what was expected of one member (its write failed).
func (r *Reconciler) forgetMember(pool types.NamespacedName, name string) {
	r.tracker().Forget(memberKey(pool, name))
}

// forgetPool drops what was expected of a pool that is gone.
func (r *Reconciler) forgetPool(pool types.NamespacedName) {
	for _, k := range r.tracker().Pending(func(p any) bool { return p == memberOfPool(pool) }) {
		r.tracker().Forget(k)
	}
}

// awaiting says whether the pool's last creations and deletions are still
// missing from members (as listed from the cache).
func (r *Reconciler) awaiting(pool types.NamespacedName, members []crawlv1alpha1.Proxy) bool {
	listed := make(map[string]string, len(members))
	for i := range members {
		listed[members[i].Name] = members[i].ResourceVersion
	}
	behindAny := false
	for _, k := range r.tracker().Pending(func(p any) bool { return p == memberOfPool(pool) }) {
		if _, behind := r.tracker().Behind(k, listed[k.Name]); behind {
			behindAny = true
		}
	}
	return behindAny
}
