package health

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/feed"
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
	// Canaries fetches the team's canaries (spec.healthCheck.targets)
	// through a proxy that passes its probes, each every CanaryInterval,
	// and to one host at most once per CanaryHostInterval across the
	// fleet; Outcomes takes what they learn. Nil Canaries: none are
	// fetched.
	Canaries           CanaryProber
	Outcomes           OutcomeSink
	CanaryInterval     time.Duration
	CanaryHostInterval time.Duration
	// EchoURL, when set, answers with the address a request came from; a
	// probe that passes asks it (every EgressRecheck) to learn the proxy's
	// exit IP, recorded as status.egressIP when it differs from its IP.
	EchoURL string
	// Shard, if set, divides the fleet among the replicas: the engine runs
	// on every replica, probes and records only the proxies Shard says are
	// its own, and follows the others' verdicts in their status (for
	// discovery and the reconciler). Nil: it probes every proxy, on the
	// leader only.
	Shard Shard
	// MaxProbesPerSecond bounds the probes this replica starts each second
	// (0: no bound). Each probe opens a connection from this replica's
	// node, which stays in the node's connection-tracking table for about
	// 120 s after it closes: the bound holds those entries under
	// 120 s × the bound (× 2 for proxies also checked for being open).
	MaxProbesPerSecond float64
	// IdleInterval, when longer than a proxy's interval, is how often a
	// Healthy proxy without a live lease is probed (Envoy's
	// no_traffic_interval): an idle fleet costs probes, and connection-
	// tracking entries, at this rate instead. Traffic says which proxies
	// carry traffic; without it every proxy is probed at its interval.
	IdleInterval time.Duration
	Traffic      Traffic
	// TargetSuspect, if set, is the reconciler's rule for when unhealthy of
	// probed Managed proxies sharing a probe URL point at the URL rather
	// than at the proxies; the engine stamps when each URL last met it
	// (TargetHealth.LastSuspect), so proxies still Unhealthy as an outage
	// ends are given their full time from its end.
	TargetSuspect func(unhealthy, probed int) bool
	// Elected is closed once this replica leads (the manager's Elected()).
	// With a Shard, verdict changes go to Notify only then: only the
	// leader's reconciler reads it. Nil: always.
	Elected <-chan struct{}
}

// Shard says which proxies this replica probes (shard.Member).
type Shard interface {
	// Owns says whether key (namespace/name) is this replica's to probe.
	Owns(key string) bool
	// Changes receives a value whenever what Owns answers may have changed.
	Changes() <-chan struct{}
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
	// pacer spaces the canaries to each host across the fleet.
	pacer hostPacer
	// probeRate enforces MaxProbesPerSecond (nil: no bound).
	probeRate *rate.Limiter
	// synced is closed once the engine knows every Proxy (Synced).
	synced chan struct{}
	// passedOn: when each proxy's last ask for a probe was passed on to
	// another replica (AskProbe).
	passedOn *lru.Cache
}

// NewEngine builds an engine; Start runs it.
func NewEngine(opts Options) *Engine {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.CanaryInterval <= 0 {
		opts.CanaryInterval = DefaultCanaryInterval
	}
	if opts.CanaryHostInterval <= 0 {
		opts.CanaryHostInterval = DefaultCanaryHostInterval
	}
	var probeRate *rate.Limiter
	if opts.MaxProbesPerSecond > 0 {
		probeRate = rate.NewLimiter(rate.Limit(opts.MaxProbesPerSecond), max(1, int(opts.MaxProbesPerSecond/10)))
	}
	return &Engine{
		opts:      opts,
		probeRate: probeRate,
		synced:    make(chan struct{}),
		pacer:     hostPacer{interval: opts.CanaryHostInterval},
		targets:   map[types.NamespacedName]*target{},
		byURL:     map[string]*urlCount{},
		passedOn:  lru.New(passedOnMemory),
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[probeItem]{
			Name: "health", Clock: opts.Clock,
		}),
	}
}

// NeedLeaderElection makes an engine without a Shard run on the leader
// only: one prober per proxy, one writer of its Healthy condition. With a
// Shard every replica runs one, each the only prober of its share.
func (e *Engine) NeedLeaderElection() bool { return e.opts.Shard == nil }

// Start follows Proxies through the cache and probes until ctx ends.
func (e *Engine) Start(ctx context.Context) error {
	informer, err := e.opts.Cache.GetInformer(ctx, &crawlv1alpha1.Proxy{})
	if err != nil {
		return fmt.Errorf("getting the Proxy informer: %w", err)
	}
	reg, err := informer.AddEventHandler(feed.Handler(e.track, func(p *crawlv1alpha1.Proxy) { e.forget(client.ObjectKeyFromObject(p)) }))
	if err != nil {
		return fmt.Errorf("watching Proxies: %w", err)
	}
	defer func() { _ = informer.RemoveEventHandler(reg) }()
	if e.opts.Shard != nil {
		go e.followShard(ctx)
	}
	if e.opts.Traffic != nil && e.opts.IdleInterval > 0 {
		go e.followTraffic(ctx)
	}
	if e.opts.Traffic != nil {
		go e.followAsks(ctx)
	}
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			close(e.synced)
		}
	}()
	e.runWorkers(ctx)
	return nil
}

// WaitSynced returns true once the engine has taken up every Proxy the
// cache held when it started, false if ctx ends first: a shard member
// joins only then, so that it never takes a share it cannot probe yet
// (shard.Options.WaitReady).
func (e *Engine) WaitSynced(ctx context.Context) bool {
	select {
	case <-e.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// followShard takes up the proxies this replica gains and drops those it
// loses, whenever the shard's members change, until ctx ends.
func (e *Engine) followShard(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.opts.Shard.Changes():
			gained, lost := e.rebalance()
			logf.FromContext(ctx).Info("this replica's share of the probing changed", "gained", gained, "lost", lost)
			e.settleUntracked(ctx)
		}
	}
}

// settleUntracked queues a settle of every Proxy this replica owns now
// but does not probe (it does not serve): one that stopped serving while
// its owner was gone may still say Ready, and nothing else would correct
// it until its next change. A settle writes only what is stale.
func (e *Engine) settleUntracked(ctx context.Context) {
	if e.opts.Client == nil {
		return
	}
	var list crawlv1alpha1.ProxyList
	if err := e.opts.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "listing Proxies to settle those gained that do not serve")
		return
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	for i := range list.Items {
		key := client.ObjectKeyFromObject(&list.Items[i])
		if _, tracked := e.targets[key]; !tracked && e.owns(key) {
			e.queue.Add(probeItem{key: key, settle: true})
		}
	}
}

// rebalance brings each proxy's ownership up to what the shard says now:
// a proxy gained is probed within the jitter (its last probe was another
// replica's); a proxy lost has its probe in flight cancelled and its
// verdict followed from its status from now on. It says how many proxies
// it took up and handed over.
func (e *Engine) rebalance() (gained, lost int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for key, t := range e.targets {
		owned := e.owns(key)
		switch {
		case owned && !t.owned:
			t.owned = true
			gained++
			due := e.spread(t.settings.Value().Interval)
			if t.tracker.verdict == Unknown {
				due = 0 // not Ready until its first verdict
			}
			e.queue.AddAfter(probeItem{key: key}, due)
		case !owned && t.owned:
			t.handOver()
			lost++
		}
	}
	shardChanges.WithLabelValues("gained").Add(float64(gained))
	shardChanges.WithLabelValues("lost").Add(float64(lost))
	return gained, lost
}

// handOver stops probing t here: its probe in flight is cancelled, and its
// verdict is followed from its status from now on. The caller holds the
// engine's lock.
func (t *target) handOver() {
	t.owned, t.idle = false, false
	t.probedAt, t.lastProbe = time.Time{}, time.Time{}
	if t.cancelProbe != nil {
		t.cancelProbe()
	}
}

// owns says whether key is this replica's to probe and record.
func (e *Engine) owns(key types.NamespacedName) bool {
	return e.opts.Shard == nil || e.opts.Shard.Owns(key.String())
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

// work probes the next due proxy; it returns false once the queue shuts down.
func (e *Engine) work(ctx context.Context) bool {
	item, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(item)
	switch {
	case item.settle:
		e.settle(ctx, item.key)
		return true
	case item.notify:
		return e.notify(ctx, item.key)
	}
	key := item.key

	if e.probeRate != nil {
		if err := e.probeRate.Wait(ctx); err != nil {
			return true // shutting down
		}
	}
	start := e.opts.Clock.Now()
	probeCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.mu.Lock()
	t, ok := e.targets[key]
	if ok && t.owned && !e.owns(key) {
		// The shard lapsed (this replica's Lease is past its renew
		// deadline) before it said so: handed over now, so that the
		// rebalance that takes it up again schedules it.
		t.handOver()
	}
	ok = ok && t.owned
	var identity string
	var pt probeTarget
	var echo bool
	if ok {
		identity, pt = t.identity, t.probeTarget
		t.lastProbe, t.cancelProbe = start, cancel
		echo = e.opts.EchoURL != "" && (t.egressCheckedAt.IsZero() || start.Sub(t.egressCheckedAt) >= EgressRecheck)
	}
	e.mu.Unlock()
	if !ok {
		return true // forgotten while it waited, or another replica's now
	}

	result := e.probe(probeCtx, key, pt, echo)
	observeProbe(result, e.opts.Clock.Since(start))

	e.mu.Lock()
	t, ok = e.targets[key]
	if ok && t.identity == identity {
		t.cancelProbe = nil
	}
	if !ok || t.identity != identity || !t.owned || probeCtx.Err() != nil && ctx.Err() == nil {
		// Deleted, replaced or handed over during the probe (perhaps
		// taken up again since, and scheduled then): the result is stale.
		e.mu.Unlock()
		return true
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
	recordChanged := t.learnEgress(result, pt.address)
	verdict, written, managed := t.tracker.verdict, t.written, t.managed
	idle := e.idleCadence(settings, verdict, t.tracker.lastSuccess, t.idle)
	var due []crawlv1alpha1.CanaryTarget
	if verdict == Healthy && e.opts.Canaries != nil {
		due = t.dueCanaries(t.probedAt)
	}
	e.mu.Unlock()

	if changed && managed && !e.notify(ctx, key) {
		return false
	}
	if len(due) > 0 && e.runCanaries(ctx, key, identity, pt, due) {
		recordChanged = true
	}
	if (verdict != written && verdict != Unknown) || recordChanged {
		e.settle(ctx, key)
	}
	// Due from this probe's start: its length, its canaries and its status
	// write do not stretch the interval a verdict's age is bounded by.
	e.queue.AddAfter(probeItem{key: key}, max(0, start.Add(e.nextProbe(settings, verdict, idle)).Sub(e.opts.Clock.Now())))
	return true
}

// nextProbe is how long after a probe starts the next is due: the idle
// interval for a proxy at the idle cadence (idleCadence), else its own.
func (e *Engine) nextProbe(settings Settings, verdict Verdict, idle bool) time.Duration {
	if idle {
		return e.opts.IdleInterval + e.spread(e.opts.IdleInterval)
	}
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
	if e.opts.Notify == nil || !e.leading() {
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

// leading says whether Notify has a reader: always without a Shard (the
// engine runs on the leader only), else once this replica leads.
func (e *Engine) leading() bool {
	if e.opts.Shard == nil || e.opts.Elected == nil {
		return true
	}
	select {
	case <-e.opts.Elected:
		return true
	default:
		return false
	}
}

// probeCredentialsLifetime is how long the credentials a probe signs for
// itself (on a proxy that takes per-lease ones) are good for: the probe's
// own, never handed out, so the expiry only has to outlast the probe.
const probeCredentialsLifetime = time.Minute

// probe probes the proxy key at pt once, with its credentials when it
// takes some (signed for the probe, on a proxy that takes per-lease ones),
// and asks the echo URL for its exit IP when echo is set.
func (e *Engine) probe(ctx context.Context, key types.NamespacedName, pt probeTarget, echo bool) Result {
	settings := pt.settings.Value()
	req := ProbeRequest{ProxyAddr: pt.address, Target: settings.URL, Timeout: settings.Timeout, CheckOpen: pt.checkOpen}
	if echo {
		req.EchoURL = e.opts.EchoURL
	}
	creds, err := e.credentialsFor(ctx, key, pt)
	if err != nil && !req.CheckOpen {
		return Result{Reason: ReasonCredentialsUnavailable, Message: err.Error()}
	}
	// A Managed proxy without its record (built before records existed)
	// is still checked for being open, then probed bare.
	req.Credentials = creds
	return e.opts.Prober.Probe(ctx, req)
}

// credentialsFor is what the engine presents to the proxy at pt: none for
// a proxy that takes none, else its credentials signed for the engine (the
// proxy checks the expiry on its own, wall, clock).
func (e *Engine) credentialsFor(ctx context.Context, key types.NamespacedName, pt probeTarget) (credentials.Credentials, error) {
	if !pt.hasCreds || e.opts.Credentials == nil {
		return credentials.Credentials{}, nil
	}
	creds, err := e.opts.Credentials.Lookup(ctx, pt.creds.Value())
	if err != nil {
		return credentials.Credentials{}, err
	}
	return creds.SignedFor(key.String(), "probe", time.Now().Add(pt.settings.Value().Timeout+probeCredentialsLifetime))
}

// UndecidedRetry is how soon a proxy without a verdict is probed again.
const UndecidedRetry = 2 * time.Second

// spreadOver is a random delay up to the whole interval (none without
// Jitter): when the engine starts with a fleet it did not probe, so that
// its probes start at the rate they keep, not in a burst (50,000 proxies
// known at a restart would otherwise all be due within the jitter).
func (e *Engine) spreadOver(interval time.Duration) time.Duration {
	if e.opts.Jitter <= 0 {
		return 0
	}
	return time.Duration(rand.Float64() * float64(interval))
}

// spread is a random delay up to Jitter of interval.
func (e *Engine) spread(interval time.Duration) time.Duration {
	if e.opts.Jitter <= 0 {
		return 0
	}
	return time.Duration(rand.Float64() * e.opts.Jitter * float64(interval))
}
