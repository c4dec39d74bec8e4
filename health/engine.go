package health

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// Settings are how a proxy is probed; the engine's defaults come from flags,
// and a Proxy's spec.healthCheck overrides them field by field.
type Settings struct {
	URL              string
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int
	SuccessThreshold int
}

// Defaults for the engine's flags.
const (
	DefaultURL              = "https://www.gstatic.com/generate_204"
	DefaultInterval         = 30 * time.Second
	DefaultTimeout          = 10 * time.Second
	DefaultFailureThreshold = 3
	DefaultSuccessThreshold = 1
	DefaultWorkers          = 32
	// DefaultJitter spreads probes over ±10% of the interval so thousands of
	// proxies do not probe in lockstep.
	DefaultJitter = 0.1
)

// Options configure an Engine.
type Options struct {
	// Cache supplies Proxy events (the manager's cache).
	Cache cache.Informers
	// Client reads the Proxy before a write (from the cache) and applies
	// the engine's part of its status (crawlv1alpha1.FieldManagerHealth).
	Client client.Client
	// Prober performs probes.
	Prober Prober
	// Defaults apply where a Proxy sets no override.
	Defaults Settings
	// Workers bounds concurrent probes.
	Workers int
	// Clock schedules probes and stamps lastHealthCheckTime; tests inject a
	// fake one.
	Clock clock.WithTicker
	// Jitter is the fraction of the interval probes are spread over.
	Jitter float64
	// Recorder, if set, emits an Event on the Proxy for every verdict
	// change recorded, so `kubectl describe px` tells the story.
	Recorder events.EventRecorder
	// Notify, if set, receives every Managed Proxy whose verdict changed,
	// as the kubelet's prober feeds its sync loop: the reconciler replaces
	// proxies that stay Unhealthy. The engine blocks on it, so it must be
	// read (the reconciler's channel source does).
	Notify chan<- event.GenericEvent
	// Credentials looks up the credentials a proxy's probes present, in
	// CredentialsNamespace for Managed proxies (their instances' records).
	// Nil probes without credentials.
	Credentials          CredentialsLookup
	CredentialsNamespace string
}

// CredentialsLookup reads a proxy's credentials (credentials.Reader).
type CredentialsLookup interface {
	Lookup(ctx context.Context, ref credentials.Ref) (credentials.Credentials, error)
}

// Engine probes every Ready proxy through the proxy itself, one schedule per
// proxy, with a bounded pool of workers. Verdicts live in memory (readable
// without API calls through Verdict); a Proxy's status is written only when
// its verdict changes, so steady state costs no API writes.
type Engine struct {
	opts  Options
	queue workqueue.TypedDelayingInterface[probeItem]

	mu      sync.RWMutex
	targets map[types.NamespacedName]*target
	// byURL counts the Managed targets per probe URL, and the Unhealthy
	// among them, for the reconciler's outage guard.
	byURL map[string]*urlCount
	// generation counts verdict changes, so discovery can cache on it.
	generation atomic.Uint64
}

// urlCount is how many Managed proxies are probed against one URL, and how
// many of them are Unhealthy now.
type urlCount struct{ probed, unhealthy int }

// probeTarget is what a probe of a proxy needs: where it listens, how it
// is probed, and with which credentials.
type probeTarget struct {
	address string
	// settings and creds are handles: a fleet shares a few of each, and a
	// handle is 8 bytes where each copy was 48 and 64, for every proxy.
	settings unique.Handle[Settings]
	// creds is where the proxy's credentials are (hasCreds false: it takes
	// none); checkOpen probes it without them too.
	creds     unique.Handle[credentials.Ref]
	hasCreds  bool
	checkOpen bool
}

// probeTargetOf is how a Proxy whose status is p's is probed.
func probeTargetOf(p *crawlv1alpha1.Proxy, settings Settings, credentialsNamespace string) probeTarget {
	ref, hasCreds := credentials.RefFor(p, credentialsNamespace)
	return probeTarget{address: addressOf(p), settings: unique.Make(settings), creds: unique.Make(ref), hasCreds: hasCreds, checkOpen: checksOpen(p)}
}

// target is one probed proxy.
type target struct {
	// identity changes when the proxy is replaced: a replacement starts from
	// a clean slate.
	identity string
	probeTarget
	managed bool
	tracker tracker
	// written is the verdict last recorded in status.
	written Verdict
	// decidedAt is when the probe that decided the verdict finished: the
	// status's lastHealthCheckTime.
	decidedAt time.Time
	// unhealthySince is when the current Unhealthy verdict began.
	unhealthySince time.Time
	// lastProbe is when the last probe started (zero: none yet).
	lastProbe time.Time
	// probedAt is when the last probe of this instance finished (zero:
	// none yet), for the last-probe metric.
	probedAt time.Time
	// counted is the contribution to byURL now: url, and whether Unhealthy.
	counted *countedAs
}

type countedAs struct {
	url       string
	unhealthy bool
}

// TargetHealth is what the engine knows of one proxy now.
type TargetHealth struct {
	Verdict Verdict
	// UnhealthySince is when the current Unhealthy verdict began (zero
	// unless Unhealthy).
	UnhealthySince time.Time
	// URL is the probe URL; Probed and Unhealthy count the Managed proxies
	// probed against it and the Unhealthy among them.
	URL               string
	Probed, Unhealthy int
}

// NewEngine builds an engine; Start runs it.
func NewEngine(opts Options) *Engine {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	return &Engine{
		opts:    opts,
		targets: map[types.NamespacedName]*target{},
		byURL:   map[string]*urlCount{},
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[probeItem]{
			Name: "health", Clock: opts.Clock,
		}),
	}
}

// NeedLeaderElection makes the engine run on the leader only: one prober
// per proxy, one writer of its Healthy condition.
func (e *Engine) NeedLeaderElection() bool { return true }

// Start follows Proxies through the cache and probes until ctx ends.
func (e *Engine) Start(ctx context.Context) error {
	informer, err := e.opts.Cache.GetInformer(ctx, &crawlv1alpha1.Proxy{})
	if err != nil {
		return fmt.Errorf("getting the Proxy informer: %w", err)
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.track(obj) },
		UpdateFunc: func(_, obj any) { e.track(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if p, ok := obj.(*crawlv1alpha1.Proxy); ok {
				e.forget(client.ObjectKeyFromObject(p))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching Proxies: %w", err)
	}
	defer func() { _ = informer.RemoveEventHandler(reg) }()
	e.runWorkers(ctx)
	return nil
}

// runWorkers probes with Workers goroutines until ctx ends.
func (e *Engine) runWorkers(ctx context.Context) {
	var wg sync.WaitGroup
	for range e.opts.Workers {
		wg.Go(func() {
			for e.work(ctx) {
			}
		})
	}
	<-ctx.Done()
	e.queue.ShutDown()
	wg.Wait()
}

// Verdict is the current verdict for a proxy; ok is false for proxies the
// engine does not probe (not Ready, or unknown).
func (e *Engine) Verdict(key types.NamespacedName) (Verdict, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok {
		return Unknown, false
	}
	return t.tracker.verdict, true
}

// VerdictAt is Verdict for the proxy as probed at address (host:port): ok is
// false when the engine probes it elsewhere, so a caller that has seen a new
// address before the engine has never reads the old address's verdict.
func (e *Engine) VerdictAt(key types.NamespacedName, address string) (Verdict, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok || t.address != address {
		return Unknown, false
	}
	return t.tracker.verdict, true
}

// Health is what the engine knows of one proxy; ok is false for a proxy it
// does not probe.
func (e *Engine) Health(key types.NamespacedName) (TargetHealth, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	t, ok := e.targets[key]
	if !ok {
		return TargetHealth{}, false
	}
	h := TargetHealth{Verdict: t.tracker.verdict, UnhealthySince: t.unhealthySince, URL: t.settings.Value().URL}
	if c := e.byURL[h.URL]; c != nil {
		h.Probed, h.Unhealthy = c.probed, c.unhealthy
	}
	return h, true
}

// recountLocked moves t's contribution to byURL to what it is now (its URL,
// its verdict); with remove, as t is forgotten, it only takes it away.
func (e *Engine) recountLocked(t *target, remove bool) {
	if old := t.counted; old != nil {
		c := e.byURL[old.url]
		c.probed--
		if old.unhealthy {
			c.unhealthy--
		}
		if c.probed == 0 {
			delete(e.byURL, old.url)
		}
		t.counted = nil
	}
	if remove || !t.managed {
		return
	}
	url := t.settings.Value().URL
	c := e.byURL[url]
	if c == nil {
		c = &urlCount{}
		e.byURL[url] = c
	}
	now := &countedAs{url: url, unhealthy: t.tracker.verdict == Unhealthy}
	c.probed++
	if now.unhealthy {
		c.unhealthy++
	}
	t.counted = now
}

// Generation changes whenever any verdict changes (or a proxy starts or
// stops being probed).
func (e *Engine) Generation() uint64 { return e.generation.Load() }

// track starts, updates or stops probing a Proxy as its status says.
func (e *Engine) track(obj any) {
	p, ok := obj.(*crawlv1alpha1.Proxy)
	if !ok {
		return
	}
	key := client.ObjectKeyFromObject(p)
	if !p.Serving() {
		e.forget(key)
		if _, stale := healthPartFor(p, nil, e.opts.Clock.Now()); stale {
			e.queue.Add(probeItem{key: key, settle: true})
		}
		return
	}
	settings := e.settingsFor(p)
	identity := p.Status.Instance()
	now := e.opts.Clock.Now()
	e.mu.Lock()
	t, exists := e.targets[key]
	replaced := exists && t.identity != identity
	var old *target
	if replaced {
		old = t
	}
	if !exists || replaced {
		// A new or replaced proxy starts from the verdict its status records
		// about this very instance: none after a replacement or a new
		// address, the recorded one after an operator restart (so a restart
		// causes no status writes).
		recorded, since, at := recordedVerdict(p)
		t = &target{identity: identity, written: recorded, decidedAt: at, tracker: tracker{verdict: recorded}}
		if recorded == Unhealthy {
			t.unhealthySince = since
		}
		if old != nil {
			t.counted = old.counted // recountLocked moves it
		}
		e.targets[key] = t
		e.generation.Add(1)
	}
	resettle := exists && !replaced && t.settings.Value() != settings
	t.probeTarget = probeTargetOf(p, settings, e.opts.CredentialsNamespace)
	t.managed = p.Spec.Mode == crawlv1alpha1.ModeManaged
	e.recountLocked(t, false)
	// Decided under the lock: a probe worker may be changing the verdict
	// and the last probe's time as soon as it is released.
	due, schedule := e.firstProbeDue(tracked{
		exists: exists, replaced: replaced, resettle: resettle,
		everProbed: p.Status.LastHealthCheckTime != nil, lastProbe: t.lastProbe, verdict: t.tracker.verdict,
	}, settings, now)
	known := t.knowledge()
	e.mu.Unlock()
	if schedule {
		e.queue.AddAfter(probeItem{key: key}, due)
	}
	if _, stale := healthPartFor(p, &known, now); stale {
		e.queue.Add(probeItem{key: key, settle: true})
	}
}

// tracked is what track knows of a proxy it just took up or updated.
type tracked struct {
	exists, replaced, resettle bool
	// everProbed: the status records a probe by anyone.
	everProbed bool
	lastProbe  time.Time
	verdict    Verdict
}

// firstProbeDue is when a tracked proxy is probed next, or schedule false
// when its schedule stands. Jitter aside (spread, nextProbe), it is pure.
func (e *Engine) firstProbeDue(t tracked, settings Settings, now time.Time) (due time.Duration, schedule bool) {
	switch {
	case t.replaced:
		// A replaced instance or a changed address is probed at once: an
		// address nobody has probed is never served on an old verdict.
		return 0, true
	case !t.exists && !t.everProbed:
		// A new proxy, never probed by anyone: not Ready until its first
		// verdict, so that verdict is due now.
		return 0, true
	case !t.exists:
		// Known before this engine started (a restart, a new leader):
		// spread over the interval, so thousands are not probed at once.
		return e.spread(settings.Interval), true
	case t.resettle:
		// New settings take effect at the next probe, due by the new
		// interval; the queue keeps whichever time comes first.
		if t.lastProbe.IsZero() {
			return 0, true
		}
		return max(0, t.lastProbe.Add(settings.Interval).Sub(now)), true
	}
	return 0, false
}

// forget stops probing a proxy and drops its verdict.
func (e *Engine) forget(key types.NamespacedName) {
	e.mu.Lock()
	if t, ok := e.targets[key]; ok {
		e.recountLocked(t, true)
		delete(e.targets, key)
		e.generation.Add(1)
	}
	e.mu.Unlock()
}

// work probes the next due proxy; it returns false once the queue shuts down.
func (e *Engine) work(ctx context.Context) bool {
	item, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(item)
	if item.settle {
		e.settle(ctx, item.key)
		return true
	}
	key := item.key

	start := e.opts.Clock.Now()
	e.mu.Lock()
	t, ok := e.targets[key]
	var identity string
	var pt probeTarget
	if ok {
		identity, pt = t.identity, t.probeTarget
		t.lastProbe = start
	}
	e.mu.Unlock()
	if !ok {
		return true // forgotten while it waited
	}

	result := e.probe(ctx, key, pt)
	observeProbe(result, e.opts.Clock.Since(start))

	e.mu.Lock()
	t, ok = e.targets[key]
	if !ok || t.identity != identity {
		e.mu.Unlock()
		return true // deleted or replaced during the probe: the result is stale
	}
	t.probedAt = e.opts.Clock.Now()
	settings := pt.settings.Value()
	changed := t.tracker.observe(result, settings.FailureThreshold, settings.SuccessThreshold)
	if changed {
		e.generation.Add(1)
		t.decidedAt = t.probedAt
		t.unhealthySince = time.Time{}
		if t.tracker.verdict == Unhealthy {
			t.unhealthySince = e.opts.Clock.Now()
		}
		e.recountLocked(t, false)
	}
	verdict, written, managed := t.tracker.verdict, t.written, t.managed
	e.mu.Unlock()

	if changed && managed && !e.notify(ctx, key) {
		return false
	}
	if verdict != written && verdict != Unknown {
		e.settle(ctx, key)
	}
	e.queue.AddAfter(probeItem{key: key}, e.nextProbe(settings, verdict))
	return true
}

// nextProbe is how long after a probe the next is due.
func (e *Engine) nextProbe(settings Settings, verdict Verdict) time.Duration {
	next := settings.Interval + e.spread(settings.Interval)
	if verdict == Unknown {
		// No verdict yet (a new proxy whose first probe came before its
		// Squid listened, say): it is not Ready until it has one, so the
		// next probe is due soon rather than a whole interval later.
		next = min(next, UndecidedRetry)
	}
	return next
}

// notify tells the reconciler to look at a Proxy now (Options.Notify); it
// returns false if ctx ended first.
func (e *Engine) notify(ctx context.Context, key types.NamespacedName) bool {
	if e.opts.Notify == nil {
		return true
	}
	obj := &crawlv1alpha1.Proxy{}
	obj.Namespace, obj.Name = key.Namespace, key.Name
	select {
	case e.opts.Notify <- event.GenericEvent{Object: obj}:
		return true
	case <-ctx.Done():
		return false
	}
}

// probeCredentialsLifetime is how long the credentials a probe signs for
// itself (on a proxy that takes per-lease ones) are good for: the probe's
// own, never handed out, so the expiry only has to outlast the probe.
const probeCredentialsLifetime = time.Minute

// probe probes the proxy key at pt once, with its credentials when it
// takes some (signed for the probe, on a proxy that takes per-lease ones).
func (e *Engine) probe(ctx context.Context, key types.NamespacedName, pt probeTarget) Result {
	settings := pt.settings.Value()
	req := ProbeRequest{ProxyAddr: pt.address, Target: settings.URL, Timeout: settings.Timeout, CheckOpen: pt.checkOpen}
	if pt.hasCreds && e.opts.Credentials != nil {
		creds, err := e.opts.Credentials.Lookup(ctx, pt.creds.Value())
		if err == nil {
			// The proxy checks the expiry on its own (wall) clock.
			creds, err = creds.SignedFor(key.String(), "probe", time.Now().Add(settings.Timeout+probeCredentialsLifetime))
		}
		if err != nil && !req.CheckOpen {
			return Result{Reason: ReasonCredentialsUnavailable, Message: err.Error()}
		}
		// A Managed proxy without its record (built before records
		// existed) is still checked for being open, then probed bare.
		req.Credentials = creds
	}
	return e.opts.Prober.Probe(ctx, req)
}

// UndecidedRetry is how soon a proxy without a verdict is probed again.
const UndecidedRetry = 2 * time.Second

// addressOf is where a Proxy's status says it listens (host:port).
func addressOf(p *crawlv1alpha1.Proxy) string {
	return net.JoinHostPort(p.Status.IP, strconv.Itoa(int(p.Status.Port)))
}

// checksOpen says whether a proxy's probes also check that it refuses a
// stranger: every Managed proxy must; an External one is checked when its
// spec asks.
func checksOpen(p *crawlv1alpha1.Proxy) bool {
	return p.Spec.Mode == crawlv1alpha1.ModeManaged || p.Spec.External != nil && p.Spec.External.OpenProxyCheck
}

// settingsFor applies a Proxy's overrides to the defaults.
func (e *Engine) settingsFor(p *crawlv1alpha1.Proxy) Settings {
	s := e.opts.Defaults
	hc := p.Spec.HealthCheck
	if hc == nil {
		return s
	}
	if hc.URL != "" {
		s.URL = hc.URL
	}
	if hc.Interval != nil {
		s.Interval = hc.Interval.Duration
	}
	if hc.Timeout != nil {
		s.Timeout = hc.Timeout.Duration
	}
	if hc.FailureThreshold != nil {
		s.FailureThreshold = int(*hc.FailureThreshold)
	}
	if hc.SuccessThreshold != nil {
		s.SuccessThreshold = int(*hc.SuccessThreshold)
	}
	return s
}

// spread is a random delay up to Jitter of interval.
func (e *Engine) spread(interval time.Duration) time.Duration {
	if e.opts.Jitter <= 0 {
		return 0
	}
	return time.Duration(rand.Float64() * e.opts.Jitter * float64(interval))
}
