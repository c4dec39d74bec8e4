//go:build soak

package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/cluster"
)

const (
	// operatorRestarts happen in the first 45% of the run, so the second
	// half is one process whose memory and goroutines can be judged.
	operatorRestarts = 3
	chaosTick        = time.Second
	// A killed process comes back after downAtLeast plus up to downSpread.
	downAtLeast, downSpread = 5 * time.Second, 15 * time.Second
)

// chaos breaks things on every tick: it kills Squids (in pods, behind
// External Proxies, on VMs of both clouds) and brings them back later,
// makes the fake Compute and EC2 APIs fail, terminates VMs and interrupts
// Spot instances, deletes and adds Proxies, changes pool templates (which
// roll the pool), and kills the operator a few times.
type chaos struct {
	w   *world
	rng *rand.Rand
	// next index of each pool's Proxies, for churn's new names.
	next map[string]int

	mu      sync.Mutex
	pending []revival
	counts  map[string]int
	errs    []string
	// held are the proxy addresses the chaos keeps down now (a killed
	// Squid not yet revived, one left down on purpose), with how many
	// reasons each; a proxy there may be down at the end.
	held map[string]int
	// sickAllowed is false while sickening would spoil a check: around the
	// outage, and near the end.
	sickAllowed bool
	// deaths are VMs killed behind the operator's back, waiting for a
	// Healthy successor; recoveries are how long each took, by cloud.
	deaths     []vmDeath
	recoveries map[string][]time.Duration
	outage     outagePhase
	// bans follows ban storms, burned IPs and the one-host outage.
	bans *banWatch
}

// revival brings a killed thing back at a time.
type revival struct {
	at   time.Time
	what string
	do   func() error
}

func newChaos(w *world, seed uint64, sizes map[string]int) *chaos {
	next := map[string]int{}
	for pool, n := range sizes {
		next[pool] = n
	}
	return &chaos{w: w, rng: rand.New(rand.NewPCG(seed, 0xc4a05)), next: next, counts: map[string]int{}, held: map[string]int{},
		recoveries: map[string][]time.Duration{}}
}

// run acts on every tick until ctx ends, and restarts the operator at
// random moments of [10%, 45%] of duration.
func (c *chaos) run(ctx context.Context, duration time.Duration) {
	start := time.Now()
	var restartAt []time.Time
	for range operatorRestarts {
		restartAt = append(restartAt, start.Add(time.Duration((0.10+0.35*c.rng.Float64())*float64(duration))))
	}
	sort.Slice(restartAt, func(i, j int) bool { return restartAt[i].Before(restartAt[j]) })
	// The probe target goes down at 55% for longer than the replacement
	// period, after the last restart so one process's counters span it.
	c.outage.start = start.Add(time.Duration(0.55 * float64(duration)))
	c.outage.end = c.outage.start.Add(outageLength)
	sickPause := [2]time.Time{c.outage.start.Add(-sickQuiet), c.outage.end.Add(replaceAfter + outageSettle)}
	sickStop := start.Add(duration - sickQuiet)
	// One host blocks a whole pool at 48%, after the last restart: the
	// judge's memory of the suspicion spans the rest of the run.
	hostOutageAt := start.Add(time.Duration(0.48 * float64(duration)))
	// The second replica (two-replica soak) is killed again and again, but
	// not from just before the outage until it is judged (the judgement
	// reads both processes' counters), nor in the last minute.
	nextSecondKill := start.Add(c.secondKillGap())
	secondQuiet := [2]time.Time{c.outage.start.Add(-5 * time.Second), sickPause[1]}
	secondStop := start.Add(duration - time.Minute)
	go c.trackRecoveries(ctx)
	ticker := time.NewTicker(chaosTick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			c.endOutage() // never end with the target down
			return
		case now := <-ticker.C:
			c.revive(now)
			c.outageStep(now)
			if !hostOutageAt.IsZero() && now.After(hostOutageAt) {
				hostOutageAt = time.Time{}
				c.hostOutage(context.WithoutCancel(ctx))
				continue
			}
			c.mu.Lock()
			c.sickAllowed = now.Before(sickStop) && (now.Before(sickPause[0]) || now.After(sickPause[1]))
			c.mu.Unlock()
			if len(restartAt) > 0 && now.After(restartAt[0]) {
				restartAt = restartAt[1:]
				pause := time.Second + time.Duration(c.rng.Int64N(int64(2*time.Second)))
				if err := c.w.restartOperator(pause, httpClient.CloseIdleConnections); err != nil {
					c.fail("restarting the operator: %v", err)
					return
				}
				c.count("operator killed and restarted")
				continue
			}
			if c.w.second != nil && now.After(nextSecondKill) && now.Before(secondStop) && (now.Before(secondQuiet[0]) || now.After(secondQuiet[1])) {
				nextSecondKill = now.Add(c.secondKillGap())
				pause := time.Second + time.Duration(c.rng.Int64N(int64(2*time.Second)))
				if err := c.w.second.killAndRestart(pause, httpClient.CloseIdleConnections); err != nil {
					c.fail("restarting the second replica: %v", err)
					return
				}
				c.count("second replica killed (SIGKILL) and restarted")
				continue
			}
			// An action started just before the run ends is let finish:
			// its API calls must not fail for the run's deadline.
			c.act(context.WithoutCancel(ctx))
		}
	}
}

// secondKillGap is the time to the second replica's next kill.
func (c *chaos) secondKillGap() time.Duration {
	return secondKillEvery + time.Duration(c.rng.Int64N(int64(secondKillEvery)))
}

// act does one random thing, weighted toward the common failures.
func (c *chaos) act(ctx context.Context) {
	switch n := c.rng.IntN(100); {
	case n < 22:
		c.killPodSquid()
	case n < 31:
		c.killExternalSquid()
	case n < 48:
		c.crashVM()
	case n < 63:
		c.injectFault()
	case n < 68:
		c.terminateVM()
	case n < 72:
		c.deleteVM()
	case n < 76:
		c.deletePod(ctx)
	case n < 86:
		c.sicken()
	case n < 93:
		c.churn(ctx)
	case n < 96:
		c.banStorm()
	default:
		c.replace(ctx)
	}
}

func (c *chaos) killPodSquid() {
	uids := c.w.cluster.Runner.Pods()
	if len(uids) == 0 {
		return
	}
	uid := uids[c.rng.IntN(len(uids))]
	addr := c.w.cluster.Runner.Addr(uid)
	if !c.w.cluster.Runner.KillSquid(uid) {
		return
	}
	c.count("pod Squid killed")
	c.hold(addr)
	c.later("pod Squid", func() error {
		defer c.unhold(addr)
		_, err := c.w.cluster.Runner.RestartSquid(uid)
		return err
	})
}

func (c *chaos) killExternalSquid() {
	s := c.w.squids[c.rng.IntN(len(c.w.squids))]
	s.stop()
	c.count("External Squid killed")
	c.later("External Squid", s.start)
}

func (c *chaos) crashVM() {
	vms := c.anyCloud()
	addr := vms.Crash(c.rng.IntN)
	if addr == "" {
		return
	}
	c.count("VM proxy crashed")
	c.hold(addr)
	c.later("VM proxy", func() error { vms.Recover(addr); c.unhold(addr); return nil })
}

// anyCloud is the VMs of gcp or of aws, at random.
func (c *chaos) anyCloud() *cluster.VMRunner {
	if c.rng.IntN(2) == 0 {
		return c.w.vms
	}
	return c.w.ec2VMs
}

// faults are what the fake Compute API injects: rate limiting, outages and
// replies lost after the server acted.
var faults = []fakecompute.Fault{
	{Method: "insert", Status: http.StatusTooManyRequests, Reason: "rateLimitExceeded"},
	{Method: "get", Status: http.StatusTooManyRequests, Reason: "rateLimitExceeded"},
	{Method: "delete", Status: http.StatusTooManyRequests, Reason: "rateLimitExceeded"},
	{Method: "insert", Status: http.StatusServiceUnavailable},
	{Method: "get", Status: http.StatusServiceUnavailable, Times: 3},
	{Method: "delete", Status: http.StatusServiceUnavailable},
	{Method: "aggregatedList", Status: http.StatusServiceUnavailable},
	{Method: "insert", LoseReply: true},
	{Method: "delete", LoseReply: true},
}

// ec2Faults are what the fake EC2 API injects: throttling, outages and
// replies lost after the call took effect (the SDK retries those itself,
// with the same ClientToken).
var ec2Faults = []struct {
	action   string
	err      fakeec2.APIError
	loseOnly bool
}{
	{action: "RunInstances", err: fakeec2.APIError{Status: http.StatusServiceUnavailable, Code: "RequestLimitExceeded", Message: "Request limit exceeded."}},
	{action: "DescribeInstances", err: fakeec2.APIError{Status: http.StatusServiceUnavailable, Code: "RequestLimitExceeded", Message: "Request limit exceeded."}},
	{action: "TerminateInstances", err: fakeec2.APIError{Status: http.StatusServiceUnavailable, Code: "Unavailable", Message: "The service is unavailable."}},
	{action: "DescribeInstances", err: fakeec2.APIError{Status: http.StatusServiceUnavailable, Code: "Unavailable", Message: "The service is unavailable."}},
	{action: "RunInstances", loseOnly: true},
	{action: "TerminateInstances", loseOnly: true},
}

func (c *chaos) injectFault() {
	if c.rng.IntN(2) == 0 {
		f := ec2Faults[c.rng.IntN(len(ec2Faults))]
		if f.loseOnly {
			c.w.ec2.LoseNextReply(f.action)
			c.count("EC2 fault: lost reply on " + f.action)
			return
		}
		// Four in a row outlast the SDK's own three attempts.
		for range 4 {
			c.w.ec2.FailNext(f.action, f.err)
		}
		c.count(fmt.Sprintf("EC2 fault: %s on %s", f.err.Code, f.action))
		return
	}
	f := faults[c.rng.IntN(len(faults))]
	c.w.fake.Inject(f)
	kind := fmt.Sprintf("%d", f.Status)
	if f.LoseReply {
		kind = "lost reply"
	}
	c.count(fmt.Sprintf("Compute fault: %s on %s", kind, f.Method))
}

// terminateVM stops a VM as GCE might (preemption, a host error), or an
// EC2 instance as its host's failure would: the operator must replace it.
func (c *chaos) terminateVM() {
	if c.rng.IntN(2) == 0 {
		if id, ok := c.pickInstance(); ok {
			c.w.ec2.Stop(id)
			c.count("EC2 instance stopped behind the operator's back")
		}
		return
	}
	running := c.runningVMs()
	if len(running) == 0 {
		return
	}
	name := running[c.rng.IntN(len(running))]
	c.noteDeath(name)
	c.w.fake.SetStatus(gcpZone, name, "TERMINATED")
	c.count("VM terminated behind the operator's back")
}

// churn deletes a random Proxy. A pool member's pool replaces it; an
// External Proxy is replaced by a new one, as a user would.
func (c *chaos) churn(ctx context.Context) {
	p, ok := c.pickProxy(ctx)
	if !ok {
		return
	}
	if err := c.w.cluster.Env.Client.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		c.fail("deleting Proxy %s: %v", p.Name, err)
		return
	}
	if p.PoolName() != "" {
		c.count("pool member deleted (its pool replaces it)")
		return
	}
	pool := p.Spec.Attributes[poolKey]
	c.mu.Lock()
	i := c.next[pool]
	c.next[pool]++
	c.mu.Unlock()
	if err := c.w.cluster.Env.Client.Create(ctx, c.w.newProxy(pool, i)); err != nil {
		c.fail("creating Proxy %s-%d: %v", pool, i, err)
		return
	}
	c.count("Proxy deleted and another added")
}

// replace changes what a Managed proxy's instances boot with, forcing
// replacements: every Managed proxy is a pool member, so the change is to
// its pool's template, and the pool rolls.
func (c *chaos) replace(ctx context.Context) {
	p, ok := c.pickProxy(ctx)
	if !ok || p.PoolName() == "" {
		return
	}
	c.changeTemplate(ctx, p.PoolName())
}

func (c *chaos) pickProxy(ctx context.Context) (*crawlv1alpha1.Proxy, bool) {
	var list crawlv1alpha1.ProxyList
	if err := c.w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		c.fail("listing Proxies: %v", err)
		return nil, false
	}
	if len(list.Items) == 0 {
		return nil, false
	}
	return &list.Items[c.rng.IntN(len(list.Items))], true
}

// later schedules a revival downAtLeast to downAtLeast+downSpread from now.
func (c *chaos) later(what string, do func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := time.Now().Add(downAtLeast + time.Duration(c.rng.Int64N(int64(downSpread))))
	c.pending = append(c.pending, revival{at: at, what: what, do: do})
}

// revive brings back what is due.
func (c *chaos) revive(now time.Time) {
	c.mu.Lock()
	due := takeDue(&c.pending, func(r revival) bool { return now.After(r.at) })
	c.mu.Unlock()
	for _, r := range due {
		if err := r.do(); err != nil {
			c.fail("bringing back a %s: %v", r.what, err)
			continue
		}
		c.count(r.what + " back")
	}
}

// takeDue removes the items that are due from *items, keeping the rest in
// order, and returns them: what the chaos brings back and the lease audit
// looks up.
func takeDue[T any](items *[]T, isDue func(T) bool) []T {
	var due []T
	keep := (*items)[:0]
	for _, it := range *items {
		if isDue(it) {
			due = append(due, it)
		} else {
			keep = append(keep, it)
		}
	}
	*items = keep
	return due
}

// stillDown is what was killed and not yet brought back: it stays down
// for the checks.
func (c *chaos) stillDown() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func (c *chaos) count(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[what]++
}

func (c *chaos) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// summary lists what was done, most frequent first.
func (c *chaos) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	type kv struct {
		what string
		n    int
	}
	var all []kv
	for what, n := range c.counts {
		all = append(all, kv{what, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || (all[i].n == all[j].n && all[i].what < all[j].what) })
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "  %5d  %s\n", e.n, e.what)
	}
	return b.String()
}
