package health

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Traffic says which proxies carry traffic: the lease store's live leases
// (the discovery API's and the gateway's tunnels'), which every replica
// shares, so the replica that probes a proxy knows of leases another one
// handed out. ids are the proxies' namespace/name; the answer counts each
// one's live leases, in order.
type Traffic interface {
	ActiveLeases(ctx context.Context, ids []string) ([]int, error)
}

// ProbeSoonGap is the least time between two probes of one proxy that
// ProbeSoon asks for: a burst of failed tunnels asks for one probe, not one
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

// ProbeSoon probes key now, when this replica probes it and its last probe
// started at least ProbeSoonGap ago: a tunnel that could not reach the
// proxy asks for it, so a proxy that died while idle is found by the
// tunnels that fail on it, not by its next idle-interval probe. It says
// whether it asked for a probe.
func (e *Engine) ProbeSoon(key types.NamespacedName) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.targets[key]
	if !ok || !t.owned || e.opts.Clock.Since(t.lastProbe) < ProbeSoonGap {
		return false
	}
	t.idle = false // traffic found it: probe it at the full rate until the next reading
	e.queue.Add(probeItem{key: key})
	probesAsked.Inc()
	return true
}
