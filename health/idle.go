package health

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Traffic is what the gateway's and the discovery API's traffic tells the
// engine, through the lease store every replica shares. ActiveLeases says
// which proxies carry traffic: ids are the proxies' namespace/name; the
// answer counts each one's live leases, in order, so the replica that
// probes a proxy knows of leases another one handed out. AskProbe and
// ProbesAsked carry a tunnel's ask for a probe (Engine.AskProbe) to the
// replica that probes the proxy, as lease.Store's do.
type Traffic interface {
	ActiveLeases(ctx context.Context, ids []string) ([]int, error)
	AskProbe(ctx context.Context, proxy string) error
	ProbesAsked(ctx context.Context, after int64) (proxies []string, next int64, err error)
}

// ProbeSoonGap is the least time between two probes of one proxy that
// AskProbe asks for: a burst of failed tunnels asks for one probe, not one
// per tunnel.
const ProbeSoonGap = 10 * time.Second

// idleCadence says whether a proxy is probed at the idle interval: it is
// Healthy, its last probe passed, and it had no live lease when traffic was
// last read. Anything in doubt (no reading yet, a failed probe, a verdict
// still to settle) keeps the interval.
func (e *Engine) idleCadence(settings Settings, verdict Verdict, lastPassed, idle bool) bool {
	return idle && verdict == Healthy && lastPassed && e.opts.IdleInterval > settings.Interval
}

// followTraffic reads which of this replica's proxies carry traffic once
// per default interval until ctx ends.
func (e *Engine) followTraffic(ctx context.Context) {
	ticker := e.opts.Clock.NewTicker(e.opts.Defaults.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
			e.readTraffic(ctx)
		}
	}
}

// readTraffic marks each proxy this replica probes idle or busy by its
// live leases, in one batched read. A proxy that has turned busy while
// waiting out the idle interval is due again an interval after its last
// probe (at once if that has passed), so a proxy's first leases wait at
// most one reading for probes at the full rate. A store that does not
// answer makes every proxy busy: probing more is the safe side.
func (e *Engine) readTraffic(ctx context.Context) {
	e.mu.RLock()
	keys := make([]types.NamespacedName, 0, len(e.targets))
	for key, t := range e.targets {
		if t.owned {
			keys = append(keys, key)
		}
	}
	e.mu.RUnlock()
	ids := make([]string, len(keys))
	for i, key := range keys {
		ids[i] = key.String()
	}
	leases, err := e.opts.Traffic.ActiveLeases(ctx, ids)
	if err == nil && len(leases) != len(ids) {
		err = fmt.Errorf("the lease store counted %d proxies of %d", len(leases), len(ids))
	}
	if err != nil {
		logf.FromContext(ctx).Error(err, "reading which proxies carry traffic; probing every proxy at the full interval until it answers")
		leases = nil
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.opts.Clock.Now()
	idle := 0
	for i, key := range keys {
		t, ok := e.targets[key]
		if !ok || !t.owned {
			continue
		}
		wasIdle := t.idle
		t.idle = leases != nil && leases[i] == 0
		if t.idle {
			idle++
		}
		if wasIdle && !t.idle && t.tracker.verdict == Healthy && !t.lastProbe.IsZero() {
			e.queue.AddAfter(probeItem{key: key}, max(0, t.lastProbe.Add(t.settings.Value().Interval).Sub(now)))
		}
	}
	idleProxies.Set(float64(idle))
}

// How an ask for a probe reached the replica that probes the proxy (the
// asked_total metric's "via").
const (
	viaThisReplica = "this_replica"
	viaLeaseStore  = "lease_store"
)

// ProbeAskPoll is how often each replica reads the asks for probes that
// the others passed on through the lease store (AskProbe): a proxy that
// a tunnel on another replica could not reach is probed within it.
const ProbeAskPoll = 2 * time.Second

// askTimeout bounds passing an ask on to the lease store: it is off every
// tunnel's path, and an ask lost costs only the wait for the proxy's next
// turn.
const askTimeout = time.Second

// passedOnMemory is how many proxies' last ask passed on the engine
// remembers, to pass each on at most once per ProbeSoonGap: more than a
// burst of failures ever names at once.
const passedOnMemory = 4096

// AskProbe has key probed soon by whichever replica probes it: this one at
// once (probeSoon), another through Options.Traffic, which that replica
// reads within ProbeAskPoll. A tunnel that could not reach the proxy asks,
// so a proxy that died is found by the tunnels that fail on it, not by
// its next turn (minutes away at the idle interval). A proxy is passed on
// at most once per ProbeSoonGap, in the background: the caller never
// waits on the store.
func (e *Engine) AskProbe(key types.NamespacedName) {
	if here, _ := e.probeSoon(key, viaThisReplica); here || e.opts.Traffic == nil {
		return
	}
	now := e.opts.Clock.Now()
	if last, ok := e.passedOn.Get(key); ok && now.Sub(last.(time.Time)) < ProbeSoonGap {
		return
	}
	e.passedOn.Add(key, now)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
		defer cancel()
		if err := e.opts.Traffic.AskProbe(ctx, key.String()); err != nil {
			logf.Log.WithName("health").Error(err, "passing on a tunnel's ask for a probe; the proxy is probed at its next turn", "proxy", key)
		}
	}()
}

// probeSoon probes key now, when this replica probes it and its last probe
// started at least ProbeSoonGap ago, for an ask that came via: a burst of
// failed tunnels asks for one probe, not one per tunnel. here says whether
// this replica probes key, asked whether it queued a probe.
func (e *Engine) probeSoon(key types.NamespacedName, via string) (here, asked bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.targets[key]
	if !ok || !t.owned {
		return false, false
	}
	if e.opts.Clock.Since(t.lastProbe) < ProbeSoonGap {
		return true, false
	}
	t.idle = false // traffic found it: probe it at the full rate until the next reading
	e.queue.Add(probeItem{key: key})
	probesAsked.WithLabelValues(via).Inc()
	return true, true
}

// followAsks reads the asks for probes passed on through the lease store
// every ProbeAskPoll until ctx ends, and probes those this replica probes.
func (e *Engine) followAsks(ctx context.Context) {
	ticker := e.opts.Clock.NewTicker(ProbeAskPoll)
	defer ticker.Stop()
	var cursor int64
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
			next, err := e.readAsks(ctx, cursor)
			switch {
			case err != nil && !failing:
				logf.FromContext(ctx).Error(err, "reading the asks for probes other replicas passed on; their proxies are probed at their turn until the store answers")
			case err == nil && failing:
				logf.FromContext(ctx).Info("reading the asks for probes other replicas passed on again")
			}
			failing = err != nil
			if err == nil {
				cursor = next
			}
		}
	}
}

// readAsks reads the asks passed on after cursor, probes soon those this
// replica probes, and returns the cursor for the next read.
func (e *Engine) readAsks(ctx context.Context, cursor int64) (int64, error) {
	asked, next, err := e.opts.Traffic.ProbesAsked(ctx, cursor)
	if err != nil {
		return cursor, err
	}
	for _, id := range asked {
		if namespace, name, ok := strings.Cut(id, "/"); ok {
			e.probeSoon(types.NamespacedName{Namespace: namespace, Name: name}, viaLeaseStore)
		}
	}
	return next, nil
}
