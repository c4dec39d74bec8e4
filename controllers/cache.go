package controllers

import (
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/controllers/cachelag"
)

// Kinds of the writes the reconciler's cache-lag tracker remembers.
const (
	// lagProxy: a write of the Proxy itself (finalizer, status). A pass that
	// reads the version it replaced acts on an object one write behind,
	// so it waits instead.
	lagProxy = "Proxy"
	// lagSecret: a credentials Secret or record the reconciler created or
	// updated; every worker finds it missing until the cache shows it.
	lagSecret = "Secret"
	// lagReplacement: a budgeted replacement admitted on a provider
	// instance (payload replacementOn), counted in flight until the cache
	// shows its Proxy Replacing.
	lagReplacement = "Replacement"
)

// cacheLag holds the reconciler's one cache-lag tracker and the flights
// that let one worker at a time write a given object.
type cacheLag struct {
	tracker *cachelag.Tracker
	flight  singleflight.Group
}

// lagKey is the tracker's key of a write of kind to the object key.
func lagKey(kind string, key types.NamespacedName) cachelag.Key {
	return cachelag.Key{Kind: kind, NamespacedName: key}
}

// writeOnce runs write for key unless this process wrote key and the
// cache, which shows it at version cached ("" when it does not have it),
// does not show that write yet; concurrent callers for one key share one
// write. It returns the write's payload: the one just made, or the one the
// cache is awaited for. During a fleet's bring-up every worker finds a new
// Secret missing at once: without this each would send a create bound to
// fail with AlreadyExists.
func (l *cacheLag) writeOnce(key cachelag.Key, cached string, write func() (any, error)) (any, error) {
	if payload, behind := l.tracker.Behind(key, cached); behind {
		return payload, nil
	}
	payload, err, _ := l.flight.Do(key.Kind+"/"+key.String(), func() (any, error) {
		if payload, behind := l.tracker.Behind(key, cached); behind {
			return payload, nil
		}
		payload, err := write()
		if err != nil {
			return nil, err
		}
		l.tracker.Wrote(key, cached, payload)
		return payload, nil
	})
	return payload, err
}
