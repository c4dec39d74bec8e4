//go:build soak

package soak

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
)

var soakReplicas = flag.Int("soak.replicas", 1,
	"operator processes: 2 runs them leader-elected on a shared real Redis (--lease-store=redis), the crawlers use both, and the chaos kills the second again and again")

var soakShardProbes = flag.Bool("soak.shard-probes", true,
	"with two replicas, divide the probing between them (--health-shard-probes) and check each Ready proxy's probe age; false: the leader probes every proxy")

// secondKillEvery is how often, at random within [1, 2]×, the chaos kills
// the second replica in the two-replica soak.
const secondKillEvery = 20 * time.Second

// replica is the second operator process of the two-replica soak: it
// serves discovery from its own view on the shared Redis, and leads
// whenever the first is down.
type replica struct {
	w                                    *world
	discoveryURL, probeAddr, metricsAddr string

	mu    sync.Mutex
	op    *cluster.Operator
	up    atomic.Bool
	kills int
}

func (r *replica) start() error {
	op, err := r.w.cluster.StartOperator(r.w.bin, cluster.OperatorOptions{
		DiscoveryAddr: r.discoveryURL[len("http://"):], ProbeAddr: r.probeAddr,
		ExtraArgs: r.w.operatorArgs(r.metricsAddr),
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.op = op
	r.mu.Unlock()
	r.w.mu.Lock()
	r.w.logs = append(r.w.logs, op.Log)
	r.w.mu.Unlock()
	r.up.Store(true)
	return nil
}

func (r *replica) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.op.Stop()
}

// killAndRestart kills the replica as a crash would (SIGKILL) and starts it
// again after pause; idle drops the crawlers' connections to it.
func (r *replica) killAndRestart(pause time.Duration, idle func()) error {
	r.w.keepReplacements(r.metricsAddr)
	r.up.Store(false)
	r.mu.Lock()
	r.op.Kill()
	r.kills++
	r.mu.Unlock()
	time.Sleep(pause)
	idle()
	return r.start()
}

func (r *replica) killCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kills
}

// pickDiscovery is where a crawler's request goes: with one replica, the
// operator; with two, either at random, as a Service spreads requests
// over ready endpoints (a replica that is down is not ready, so it is
// skipped while the other is up). up tells whether that process was up.
func (w *world) pickDiscovery() (url string, up *atomic.Bool) {
	if w.second == nil {
		return w.discoveryURL, &w.operatorUp
	}
	first, second := w.operatorUp.Load(), w.second.up.Load()
	if second && (!first || rand.IntN(2) == 1) {
		return w.second.discoveryURL, &w.second.up
	}
	return w.discoveryURL, &w.operatorUp
}

// sharedState checks, in the two-replica soak, that the shared store keeps
// what a killed replica knew: no lease a crawler holds answers 404 before
// its TTL, and no lease goes to a proxy for a target it was reported
// rate-limited for, while that cooldown runs.
type sharedState struct {
	mu sync.Mutex
	// cooling: (proxy, target) -> the cooldown a crawler was told about.
	cooling map[[2]string]cooldownSeen
	// checked counts the leases granted for a (proxy, target) that had
	// been reported rate-limited before: proof the check ran.
	checked   int
	lost      []string
	forgotten []string
}

type cooldownSeen struct {
	acked, until time.Time
}

// cooldownSlack allows for the store's clock against the test's: a lease
// granted within this of the cooldown's end is not held against it.
const cooldownSlack = time.Second

// reported notes a rate_limited report the API acknowledged at acked,
// sent at sent with retryAfter: the proxy cools for target until
// sent+retryAfter at least, the site's own word with adaptive pacing (the
// default), or sent+cooldown when the report names none.
func (s *sharedState) reported(proxy, target string, sent, acked time.Time, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cooling == nil {
		s.cooling = map[[2]string]cooldownSeen{}
	}
	key := [2]string{proxy, target}
	hold := cooldown
	if retryAfter > 0 {
		hold = retryAfter
	}
	if until := sent.Add(hold); until.After(s.cooling[key].until) {
		s.cooling[key] = cooldownSeen{acked: acked, until: until}
	}
}

// granted checks a lease of proxy for target, asked for at sent and
// answered at answered.
func (s *sharedState) granted(proxy, target string, sent, answered time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cooling[[2]string{proxy, target}]
	if !ok || sent.Before(c.acked) {
		return
	}
	s.checked++
	if answered.Before(c.until.Add(-cooldownSlack)) {
		s.forgotten = append(s.forgotten, fmt.Sprintf("%s leased for %s at %s, %s before the cooldown reported at %s ends",
			proxy, target, answered.Format(time.RFC3339Nano), c.until.Sub(answered).Round(time.Millisecond), c.acked.Format(time.RFC3339Nano)))
	}
}

// lostLease notes a 404 for a lease the crawler holds until expiresAt.
func (s *sharedState) lostLease(route, id string, at, expiresAt time.Time) {
	if at.After(expiresAt.Add(-expirySlack)) {
		return // at its end: the store may rightly have dropped it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost = append(s.lost, fmt.Sprintf("%s of lease %s answered 404 at %s, %s before it expires", route, id, at.Format(time.RFC3339Nano), expiresAt.Sub(at).Round(time.Millisecond)))
}

// probeAges watches, in the two-replica soak (which divides probing among
// the replicas), how long ago each Ready proxy was last probed by either:
// each replica exports its own share's last probes, and a replica that
// dies takes its figures with it, so the watch keeps the latest it has
// seen of each proxy. A dead replica's share must be taken up within one
// probe interval: no Ready proxy's last probe older than probeAgeBound.
type probeAges struct {
	mu   sync.Mutex
	last map[string]time.Time
	// ages are the ages of the Ready proxies' last probes, one per proxy
	// per sample; stale lists the worst offences.
	ages  []time.Duration
	stale []string
}

// probeAgeBound is the oldest a Ready proxy's last probe may be when a
// dead replica's share is taken up within one interval: its previous
// owner's interval and jitter, one interval to take it up, the new
// probe's own length (an age runs from a probe's end) and the sampling
// period.
const probeAgeBound = healthInterval*21/10 + healthTimeout + time.Second

// shardLeaseDuration is the two-replica soak's --health-shard-lease-duration:
// a handover of 2.8 s inside the 5 s probe interval.
const shardLeaseDuration = 2 * time.Second

func (a *probeAges) watch(ctx context.Context, w *world) {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			a.sample(ctx, w)
		}
	}
}

// sample scrapes the replicas that are up and judges every Ready proxy.
func (a *probeAges) sample(ctx context.Context, w *world) {
	addrs := []string{}
	if w.operatorUp.Load() {
		addrs = append(addrs, w.metricsAddr)
	}
	if w.second.up.Load() {
		addrs = append(addrs, w.second.metricsAddr)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[string]time.Time{}
	}
	for _, addr := range addrs {
		families, err := cluster.ScrapeMetrics("http://" + addr + "/metrics")
		if err != nil {
			continue // killed since: its share is the other's to take up
		}
		for _, m := range families["proxy_operator_healthcheck_last_timestamp_seconds"].GetMetric() {
			var ns, name string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					ns = l.GetValue()
				case "name":
					name = l.GetValue()
				}
			}
			at := time.Unix(0, int64(m.GetGauge().GetValue()*1e9))
			if key := ns + "/" + name; at.After(a.last[key]) {
				a.last[key] = at
			}
		}
	}
	var proxies crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &proxies); err != nil {
		return
	}
	now := time.Now()
	for i := range proxies.Items {
		p := &proxies.Items[i]
		ready := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionReady)
		last, ok := a.last[p.Namespace+"/"+p.Name]
		// Ready for a whole bound at least: a proxy that just came back
		// was probed by whoever made it Ready, perhaps before this watch
		// scraped it. Ready by the rule too (IsReady): a proxy being
		// deleted (a pool member retired) serves nobody and is probed no
		// more, though the Ready condition it will go with still says True.
		if !p.IsReady() || ready == nil || ready.Status != metav1.ConditionTrue || now.Sub(ready.LastTransitionTime.Time) < probeAgeBound || !ok {
			continue
		}
		age := now.Sub(last)
		a.ages = append(a.ages, age)
		if age > probeAgeBound && len(a.stale) < 20 {
			a.stale = append(a.stale, fmt.Sprintf("%s/%s last probed %s ago at %s", p.Namespace, p.Name, age.Round(100*time.Millisecond), now.Format(time.RFC3339)))
		}
	}
}

// summary is the ages' p50, p99 and maximum.
func (a *probeAges) summary() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.ages) == 0 {
		return "no Ready proxy judged"
	}
	sorted := slices.Clone(a.ages)
	slices.Sort(sorted)
	at := func(q float64) time.Duration {
		return sorted[int(q*float64(len(sorted)-1))].Round(100 * time.Millisecond)
	}
	return fmt.Sprintf("%d samples of Ready proxies, p50 %s, p99 %s, max %s (bound %s); older than the bound: %d",
		len(sorted), at(0.5), at(0.99), at(1), probeAgeBound, len(a.stale))
}
