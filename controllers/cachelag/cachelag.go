// Package cachelag remembers the writes a controller made that its informer
// cache does not show yet, so that a pass which reads the cache right after
// a write neither acts twice (a second create bound to fail with
// AlreadyExists, a second member for a pool) nor acts on the object one
// write behind. It is the operator's one such guard (cluster-api waits for
// its cache to reach a written resourceVersion the same way), with one
// clock, one bound on how long a write is waited for, and one metric of
// how long the cache took.
//
// It must never import the operator's components: the Proxy and pool
// controllers both use it.
package cachelag

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/example/egress-proxies-operator/operator"
)

// DefaultMaxLag is how long a write is waited for: far longer than a watch
// event takes, short enough that a lost event (a watch that broke and is
// relisted) stalls nothing for long. Past it the controller acts on what
// its cache shows.
const DefaultMaxLag = 10 * time.Second

// Recheck is how soon a pass that found the cache behind looks again: about
// what a watch event takes.
const Recheck = 50 * time.Millisecond

var lagSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: operator.MetricsNamespace,
	Name:      "cache_lag_seconds",
	Help:      "Time from a controller's write until a pass found its cache showing it (the bound, when the pass gave up waiting), by controller.",
	Buckets:   prometheus.ExponentialBuckets(0.005, 2, 12),
}, []string{"controller"})

func init() {
	ctrlmetrics.Registry.MustRegister(lagSeconds)
}

// Key names one written object: its kind (or what the write was for, when
// one controller tracks two kinds of write to one object) and its key.
type Key struct {
	Kind string
	types.NamespacedName
}

// write is one write the cache does not show yet.
type write struct {
	// replaced is the resourceVersion the write replaced, "" when it
	// created the object: the cache is behind while it shows exactly that.
	replaced string
	at       time.Time
	// payload is what the writer keeps with the write (the credentials it
	// generated, the pool a member belongs to).
	payload any
}

// Tracker is one controller's memory of its writes. The zero value is not
// usable: use New.
type Tracker struct {
	controller string
	clock      clock.PassiveClock
	maxLag     time.Duration

	mu      sync.Mutex
	writes  map[Key]write
	pruning bool
}

// New is a Tracker for controller (the metric's label), reading time from
// clk (nil: the real clock) and waiting at most maxLag (zero:
// DefaultMaxLag) for each write.
func New(controller string, clk clock.PassiveClock, maxLag time.Duration) *Tracker {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if maxLag <= 0 {
		maxLag = DefaultMaxLag
	}
	return &Tracker{controller: controller, clock: clk, maxLag: maxLag}
}

// Wrote notes a write of key that replaced version replaced ("" for a
// create), with payload.
func (t *Tracker) Wrote(key Key, replaced string, payload any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.writes == nil {
		t.writes = map[Key]write{}
	}
	t.writes[key] = write{replaced: replaced, at: t.clock.Now(), payload: payload}
	if !t.pruning {
		// A write that is never asked about again (a Proxy whose last pass
		// it was) must not stay for the object's life.
		t.pruning = true
		time.AfterFunc(t.maxLag, t.prune)
	}
}

// Behind says whether the cache, which shows key at version cached ("" when
// it does not have the object), has yet to show the last write of key, and
// returns that write's payload. Once the cache shows it (or maxLag has
// passed) the write is forgotten.
func (t *Tracker) Behind(key Key, cached string) (payload any, behind bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.writes[key]
	if !ok {
		return nil, false
	}
	waited := t.clock.Since(w.at)
	if w.replaced == cached && waited < t.maxLag {
		return w.payload, true
	}
	delete(t.writes, key)
	lagSeconds.WithLabelValues(t.controller).Observe(min(waited, t.maxLag).Seconds())
	return nil, false
}

// Pending lists the keys of the writes with a payload match accepts that
// are not known to be in the cache: a pool's members in flight, the
// replacements a provider instance has started.
func (t *Tracker) Pending(match func(payload any) bool) []Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []Key
	for k, w := range t.writes {
		if t.clock.Since(w.at) < t.maxLag && match(w.payload) {
			keys = append(keys, k)
		}
	}
	return keys
}

// Forget drops key's write: what it guarded is over (the object is gone, a
// replacement is done).
func (t *Tracker) Forget(key Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.writes, key)
}

// prune drops the writes past maxLag, and comes back while some are left.
// Once none are, the map goes with them: a Go map keeps its buckets when
// emptied, and a fleet's bring-up fills it with one entry per Proxy. A
// write nobody asked about says nothing of the cache's lag, so none is
// observed here.
func (t *Tracker) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, w := range t.writes {
		if t.clock.Since(w.at) >= t.maxLag {
			delete(t.writes, k)
		}
	}
	if len(t.writes) == 0 {
		t.writes, t.pruning = nil, false
		return
	}
	time.AfterFunc(t.maxLag, t.prune)
}
