//go:build soak

package soak

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/example/egress-proxies-operator/test/cluster"
)

var soakReplicas = flag.Int("soak.replicas", 1,
	"operator processes: 2 runs them leader-elected on a shared real Redis (--lease-store=redis), the crawlers use both, and the chaos kills the second again and again")

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
// sent at sent: the proxy cools for target until sent+cooldown at least.
func (s *sharedState) reported(proxy, target string, sent, acked time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cooling == nil {
		s.cooling = map[[2]string]cooldownSeen{}
	}
	key := [2]string{proxy, target}
	if until := sent.Add(cooldown); until.After(s.cooling[key].until) {
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
