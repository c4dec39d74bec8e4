package controllers

import (
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/credentials"
)

// cacheCatchUp is how long a pass that finds the cache behind its own last
// write waits before it looks again: a watch event takes about this long.
// After maxCacheLag it stops waiting and acts on what it has (a watch that
// broke is relisted; a conflict then is the worst that happens).
const (
	cacheCatchUp = 50 * time.Millisecond
	maxCacheLag  = 5 * time.Second
)

// writeLag remembers, per Proxy, the resourceVersion the reconciler's last
// write replaced, until the cache shows the Proxy past it. A pass that
// reads the replaced version acts on an object one write behind: its write
// is bound to conflict (and the conflict goes through the workqueue's rate
// limiter, ten a second for the whole queue), so it waits instead.
type writeLag struct {
	mu         sync.Mutex
	superseded map[types.NamespacedName]supersededVersion
	// pruning is set while a prune is due: a Proxy whose last write was its
	// last pass (Ready, nothing to requeue) is never asked about again,
	// and its entry would otherwise stay for the Proxy's life.
	pruning bool
}

type supersededVersion struct {
	version string
	at      time.Time
}

// wrote notes that a write replaced version before of key, and makes sure
// a prune is due within maxCacheLag.
func (w *writeLag) wrote(key types.NamespacedName, before string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.superseded == nil {
		w.superseded = map[types.NamespacedName]supersededVersion{}
	}
	w.superseded[key] = supersededVersion{version: before, at: time.Now()}
	if !w.pruning {
		w.pruning = true
		time.AfterFunc(maxCacheLag, w.prune)
	}
}

// prune drops the entries behind would ignore, and comes back while some
// are left. Once none are, the map goes with them: a Go map keeps its
// buckets when emptied, and a fleet's bring-up fills it with one entry per
// Proxy (about 100 bytes each).
func (w *writeLag) prune() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for k, s := range w.superseded {
		if now.Sub(s.at) >= maxCacheLag {
			delete(w.superseded, k)
		}
	}
	if len(w.superseded) == 0 {
		w.superseded, w.pruning = nil, false
		return
	}
	time.AfterFunc(maxCacheLag, w.prune)
}

// behind says whether cached, the version the cache holds of key, is one
// the reconciler has already written over (for at most maxCacheLag); once
// it is not, key is forgotten.
func (w *writeLag) behind(key types.NamespacedName, cached string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.superseded[key]
	if ok && s.version == cached && time.Since(s.at) < maxCacheLag {
		return true
	}
	delete(w.superseded, key)
	return false
}

// forget drops key (its Proxy is gone).
func (w *writeLag) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.superseded, key)
}

// generatedCredentials hands the credentials this process generated for a
// provider instance to every worker that asks within maxCacheLag, and lets
// one worker at a time generate them: during the first bring-up with a
// provider instance every worker finds its Secret missing, and each would
// otherwise send a create bound to fail with AlreadyExists (and write a
// status to say it waits).
type generatedCredentials struct {
	mu   sync.Mutex
	made map[credentials.Ref]generated
}

type generated struct {
	creds credentials.Credentials
	at    time.Time
}

// ensure returns the credentials generated for ref within maxCacheLag of
// now, or those generate makes (remembered if it succeeds).
func (g *generatedCredentials) ensure(ref credentials.Ref, now time.Time, generate func() (credentials.Credentials, error)) (credentials.Credentials, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if made, ok := g.made[ref]; ok && now.Sub(made.at) < maxCacheLag {
		return made.creds, nil
	}
	c, err := generate()
	if err != nil {
		return credentials.Credentials{}, err
	}
	if g.made == nil {
		g.made = map[credentials.Ref]generated{}
	}
	g.made[ref] = generated{creds: c, at: now}
	return c, nil
}

// recentRecords remembers the credentials records this process wrote in
// the last maxCacheLag, and lets one worker at a time write a given one.
// During a fleet's bring-up every worker creates instances of the same
// spec before the cache shows its record: without this, each would send a
// create bound to fail with AlreadyExists.
type recentRecords struct {
	flight  singleflight.Group
	mu      sync.Mutex
	written map[types.NamespacedName]time.Time
}

// ensure runs write for key unless this process wrote key within
// maxCacheLag; concurrent callers for one key share one write.
func (r *recentRecords) ensure(key types.NamespacedName, write func() error) error {
	if r.recent(key) {
		return nil
	}
	_, err, _ := r.flight.Do(key.String(), func() (any, error) {
		if r.recent(key) {
			return nil, nil
		}
		if err := write(); err != nil {
			return nil, err
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		now := time.Now()
		if r.written == nil {
			r.written = map[types.NamespacedName]time.Time{}
		}
		for k, at := range r.written {
			if now.Sub(at) >= maxCacheLag {
				delete(r.written, k)
			}
		}
		r.written[key] = now
		return nil, nil
	})
	return err
}

func (r *recentRecords) recent(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.written[key]
	return ok && time.Since(at) < maxCacheLag
}
