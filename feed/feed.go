// Package feed turns an informer's events into typed upserts and removes:
// the one way an in-memory index (the broker's view of Proxies, its
// quotas and politeness policies, the health engine's targets) follows the
// manager's cache. A delete the informer missed arrives as a tombstone,
// which feed unwraps, so no index keeps an object the cluster no longer
// has. It imports nothing of the operator.
package feed

import toolscache "k8s.io/client-go/tools/cache"

// Handler calls upsert with each T added or updated and remove with each
// T deleted (a tombstone's last known state included); objects of other
// types are ignored.
func Handler[T any](upsert, remove func(T)) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if t, ok := obj.(T); ok {
				upsert(t)
			}
		},
		UpdateFunc: func(_, obj any) {
			if t, ok := obj.(T); ok {
				upsert(t)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if t, ok := obj.(T); ok {
				remove(t)
			}
		},
	}
}
