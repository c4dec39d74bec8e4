//go:build soak

package soak

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/test/cluster"
)

var (
	soakDuration = flag.Duration("soak.duration", 6*time.Minute, "how long the faults and the load run (the bring-up before and the checks after come on top)")
	soakScale    = flag.Float64("soak.scale", 1, "fraction of the 500 Proxies to run (0.1 for a quick rehearsal)")
	soakSeed     = flag.Uint64("soak.seed", 0, "seed of the random choices; 0 takes one from the clock (the run prints it, to replay a run's choices)")
)

// sizes is how many Proxies of each group the soak keeps, 500 in all: the
// Managed ones as members of ProxyPools, one per provider instance
// (pools_test.go), the External ones as single Proxies.
var sizes = map[string]int{poolKubernetes: 100, poolVM: 200, poolExternal: 200}

const (
	// recoverWithin is the time past the replacement period in which a
	// proxy left down is replaced and its successor Healthy.
	recoverWithin  = 90 * time.Second
	bringUpTimeout = 5 * time.Minute
	convergeWithin = 3 * time.Minute
	// verdictsWithin: a dead proxy is Unhealthy after failureThreshold
	// probes, a revived one Healthy after one; twice that, and jitter.
	verdictsWithin = 2 * (failureThreshold + 2) * healthInterval
	sampleEvery    = 2 * time.Second
	// Flat: the last quarter's median is within 10% (plus a little for
	// noise) of the third quarter's.
	flatRatio    = 1.10
	flatRSSSlack = 8 << 20
	// flatRedisSlack is what Redis's memory may grow by beyond flatRatio:
	// its allocator's steps.
	flatRedisSlack = 2 << 20
	flatGoroutines = 20
)

func TestSoak(t *testing.T) {
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	if *soakScale <= 0 || *soakScale > 1 {
		t.Fatalf("-soak.scale must be in (0, 1], got %g", *soakScale)
	}
	for pool, n := range sizes {
		sizes[pool] = max(1, int(float64(n)**soakScale))
	}
	t.Logf("soak: %d Proxies for %s, seed %d (replay with -soak.seed=%d)", total(sizes), *soakDuration, seed, seed)
	w := newWorld(t)
	c := w.cluster.Env.Client
	ctx := context.Background()

	conflicts0, err := w.cluster.StatusConflicts()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range sizes[poolExternal] {
		if err := c.Create(ctx, w.newProxy(poolExternal, i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, pool := range newPools(sizes) {
		if err := c.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, bringUpTimeout, "every Proxy Ready", func() []string { return w.notReady(ctx) })
	bringUp := time.Since(start)
	t.Logf("soak: %d Proxies Ready in %s; faults and load for %s", total(sizes), bringUp.Round(time.Second), *soakDuration)

	runCtx, stop := context.WithTimeout(ctx, *soakDuration)
	defer stop()
	l, ch, s := newLoad(w), newChaos(w, seed, sizes), &sampler{w: w}
	bw := newBanWatch()
	ch.bans = bw
	if w.redis != nil {
		s.redis = redis.NewClient(&redis.Options{Addr: w.redis.Addr})
		defer s.redis.Close()
	}
	soakStart := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { l.run(runCtx, seed) })
	wg.Go(func() { ch.run(runCtx, *soakDuration) })
	wg.Go(func() { s.run(runCtx) })
	wg.Go(func() { bw.watch(runCtx, w, w.burnedSince) })
	ages := &probeAges{}
	if w.second != nil && *soakShardProbes {
		wg.Go(func() { ages.watch(runCtx, w) })
	}
	wg.Wait()
	soakEnd := time.Now()
	if err := w.stopRecycling(ctx); err != nil {
		t.Fatal(err)
	}
	leftDown := ch.leaveSomeDown()

	// Every Proxy converges on an instance of its own, and nothing else
	// is left running.
	checkStart := time.Now()
	converged := eventually(convergeWithin, func() []string { return w.inventory(ctx) })
	convergence := time.Since(checkStart)
	// Each verdict matches what a probe of our own finds, in the status and
	// in the discovery API.
	var wantUnhealthy int
	verdictStart := time.Now()
	mismatched := eventually(verdictsWithin, func() []string {
		problems, down := w.verdictCheck(ctx)
		wantUnhealthy = down
		return problems
	})
	verdictsAgreed := time.Since(verdictStart)
	// The fleet recovered: every Managed proxy is Ready and Healthy, but
	// for those the chaos holds down at this moment (counted apart). The
	// ones left down on purpose are replaced within the period.
	var heldDown int
	recoveryStart := time.Now()
	unrecovered := eventually(replaceAfter+recoverWithin, func() []string {
		problems, held := w.unrecovered(ctx, ch)
		heldDown = held
		return problems
	})
	recovered := time.Since(recoveryStart)
	// Every pool is whole again: its replicas, all available and of its
	// current template, spread over its zones.
	poolsStart := time.Now()
	poolProblems := eventually(convergeWithin, func() []string { return w.poolProblems(ctx) })
	poolsSettled := time.Since(poolsStart)
	gcDeleted, gcLive, gcErr := w.gcAudit(ctx)
	bw.sample(ctx, w, w.burnedSince())
	bw.mu.Lock()
	bw.outageTold = w.outageTold(ctx)
	bw.mu.Unlock()
	replacements := w.totalReplacements()
	var recoveries strings.Builder
	recoveredBy := map[string]int{}
	for _, cloud := range []string{"gcp", "aws"} {
		median, longest, n, waiting := ch.recoveryTimes(cloud)
		recoveredBy[cloud] = n
		fmt.Fprintf(&recoveries, "\n  %s: %d measured, median %s, max %s (still waiting: %d)", cloud, n, median.Round(time.Second), longest.Round(time.Second), waiting)
	}
	// Every abandoned lease is gone once its TTL is, and no proxy counts a
	// lease any more.
	time.Sleep(maxRequestedTTL + expirySlack)
	l.auditDue()
	leftLeases := w.activeLeases()
	rss, goroutines, redisMem, sameProcess := s.flatness(soakStart.Add(*soakDuration/2), soakEnd)
	// Two writers of each Proxy's status (the reconciler and the health
	// engine), each applying only its own fields: the API server must never
	// have refused one of their writes for a conflict.
	conflicts, err := w.cluster.StatusConflicts()
	if err != nil {
		t.Fatal(err)
	}
	conflicts -= conflicts0
	var ledgerIPs int
	var ledgerProblems []string
	if w.second != nil {
		ledgerIPs, ledgerProblems = l.held.checkLedger([]string{w.discoveryURL, w.second.discoveryURL})
		fmt.Fprintf(os.Stdout, "ledger: %d exit IPs asked of both replicas, %d wrong answers; Redis memory (less the ledger) median %s -> %s MiB over the last half\n",
			ledgerIPs, len(ledgerProblems), mib(redisMem[0]), mib(redisMem[1]))
	}

	fmt.Fprintf(os.Stdout, `
=== soak figures (seed %d) ===
Proxies: %v, %d in all; bring-up to Ready: %s
faults and load: %s; operator restarts: %d; chaos still down at the end: %d (+ %s left down on purpose)
what the chaos did:
%sCompute API requests: insert %d, get %d, delete %d, aggregatedList %d; VMs ever created: %d
EC2 API requests: RunInstances %d, DescribeInstances %d, TerminateInstances %d; instances ever run: %d
convergence after the chaos: %s (problems left: %d)
health verdicts against our own probes: %d mismatched after %s, %d proxies really down at the end
discovery: %d answered, %.0f/s, p50 %s, p99 %s; unexpected statuses: %d; unanswered while the operator was up: %d (while it was down: %d)
%sleases granted: %d; abandoned leases audited after their TTL: %d, still alive: %d; active leases counted at the end: %d
replicas: %s
operator over the last half (%d samples, one process: %t): RSS median %s -> %s MiB, goroutines median %s -> %s
self-healing: Managed proxies not Ready and Healthy at the end: %d (held down by the chaos at that moment: %d), recovered within %s
pools: %d, recycled by age every %s during the faults; not whole at the end: %d, settled within %s
replacements by cause:%s
VM killed behind the operator's back -> successor Healthy, by cloud:%s
probe target outage of %s: replacements for being Unhealthy during it %.0f, passes that held one back %.0f
orphan GC: %d instances deleted, %d of them live
status writes the API server refused with 409 Conflict, bring-up to the end: %.0f
bans: %s
`, seed, sizes, total(sizes), bringUp.Round(time.Second),
		*soakDuration, w.restarts, ch.stillDown(), leftDown, ch.summary(),
		w.fake.Requests("insert"), w.fake.Requests("get"), w.fake.Requests("delete"), w.fake.Requests("aggregatedList"), w.fake.Created(),
		w.ec2.Calls("RunInstances"), w.ec2.Calls("DescribeInstances"), w.ec2.Calls("TerminateInstances"), len(w.ec2.Instances()),
		convergence.Round(time.Second), len(converged), len(mismatched), verdictsAgreed.Round(time.Second), wantUnhealthy,
		l.requests(), float64(l.requests())/soakEnd.Sub(soakStart).Seconds(), l.latency(0.5).Round(time.Microsecond), l.latency(0.99).Round(time.Microsecond),
		len(l.unexpected), len(l.failedWhileUp), l.failedWhileDown, l.statusTable(),
		l.granted, l.audited, len(l.outlivedTTL), leftLeases, w.replicasFigure(l),
		s.count(soakStart.Add(*soakDuration/2), soakEnd), sameProcess, mib(rss[0]), mib(rss[1]), strconv.Itoa(int(goroutines[0])), strconv.Itoa(int(goroutines[1])),
		len(unrecovered), heldDown, recovered.Round(time.Second),
		len(soakPools), poolMaxAge, len(poolProblems), poolsSettled.Round(time.Second), formatCauses(replacements),
		recoveries.String(),
		outageLength, ch.outage.replacedDuring, ch.outage.heldDuring,
		gcDeleted, len(gcLive), conflicts, bw.summary())
	if conflicts != 0 {
		t.Errorf("the API server answered %.0f of the operator's status writes with 409 Conflict", conflicts)
	}

	report(t, "chaos could not do its work", ch.errs)
	report(t, "not converged, leaked, duplicated or on the wrong address", converged)
	if len(converged) > 0 {
		name, _, _ := strings.Cut(converged[0], ":")
		t.Logf("the operator's last lines about %s:\n%s", name, strings.Join(w.logLinesAbout(name, 40), "\n"))
	}
	report(t, "health verdict does not match the proxy's real state", mismatched)
	if wantUnhealthy == 0 {
		t.Error("no proxy was down at the end: the verdict check proved nothing")
	}
	report(t, "Managed proxy not recovered (not Ready and Healthy, and not held down by the chaos)", unrecovered)
	if len(unrecovered) > 0 {
		name, _, _ := strings.Cut(unrecovered[0], " ")
		t.Logf("the operator's last lines about %s:\n%s", name, strings.Join(w.logLinesAbout(name, 40), "\n"))
	}
	report(t, "orphan GC deleted a live instance", gcLive)
	if gcErr != nil {
		t.Errorf("auditing orphan GC: %v", gcErr)
	}
	report(t, "the outage phase could not be judged", ch.outage.errs)
	switch {
	case !ch.outage.over:
		t.Error("the probe-target outage phase did not run to its end: the run is too short")
	case ch.outage.replacedDuring != 0:
		t.Errorf("%.0f proxies were replaced for being Unhealthy while the probe target was down", ch.outage.replacedDuring)
	case ch.outage.heldDuring == 0:
		t.Error("no replacement was held back during the outage: the outage guard was never tested")
	}
	report(t, "ProxyPool not whole after the faults", poolProblems)
	report(t, "a proxy was Ready on an IP burned before its instance served", bw.served)
	report(t, "a member was banned for a host that blocked its whole pool (the one-host outage)", bw.outageBanned)
	report(t, "the one-host outage could not be set up", bw.outageErrs)
	switch {
	case len(bw.outageMembers) < 3:
		t.Errorf("the one-host outage blocked %d members of %s: too few to test the guard", len(bw.outageMembers), outagePool)
	case !bw.outageTold:
		t.Errorf("%s was never told its host %s is suspect: the per-host guard went untested", outagePool, outageHost)
	}
	if replacements[poolCause("Banned")] == 0 {
		t.Error("no pool member was replaced for a ban: ban storms went untested")
	}
	// Whether a burned IP comes back to an instance of the same provider
	// instance is the fakes' chance (a released address goes to whichever
	// pod or VM starts next, of either provider instance): replacements
	// by cause show BurnedIP when it did. e2e's bans test makes it happen.
	for _, cause := range []string{"InstanceFailed", "InstanceLost", poolCause("UnhealthyTooLong"), poolCause("MaxAge")} {
		if replacements[cause] == 0 {
			t.Errorf("no replacement with cause %s: that path went untested", cause)
		}
	}
	if ch.counts["pool template changed (the pool rolls)"] > 0 && replacements[poolCause("TemplateChanged")] == 0 {
		t.Error("a pool template changed, but no member was replaced for it")
	}
	// Both clouds heal alike: each cloud's dead VMs came back Healthy on a
	// new address, and every other check above covers both.
	for cloud, n := range recoveredBy {
		if n == 0 {
			t.Errorf("no %s VM death was followed to a Healthy successor", cloud)
		}
	}
	report(t, "discovery answered with an undocumented status", l.unexpected)
	report(t, "discovery did not answer while the operator was up", l.failedWhileUp)
	report(t, "a lease outlived its TTL", l.outlivedTTL)
	if w.second != nil {
		report(t, "a lease was lost before its TTL (the shared store forgot it)", l.shared.lost)
		report(t, "a cooldown was forgotten (a proxy leased for a target it was cooling down for)", l.shared.forgotten)
		if w.second.killCount() == 0 {
			t.Error("the second replica was never killed: the shared store went untested")
		}
		if *soakShardProbes {
			fmt.Fprintf(os.Stdout, "last probe of each Ready proxy, across both replicas: %s\n", ages.summary())
			report(t, "a Ready proxy's last probe was older than probeAgeBound (a dead replica's share not taken up within one interval)", ages.stale)
			if len(ages.ages) == 0 {
				t.Error("no Ready proxy's probe age was judged: the handover went unchecked")
			}
		}
		if l.shared.checked == 0 {
			t.Error("no lease was checked against a reported cooldown: the cooldown check proved nothing")
		}
		report(t, "the ledger did not name the lease that held an exit IP", ledgerProblems)
		if ledgerIPs == 0 {
			t.Error("no exit IP was asked of the ledger: the check proved nothing")
		}
		if redisMem[1] > redisMem[0]*flatRatio+flatRedisSlack {
			t.Errorf("Redis memory (less the ledger) grew over the last half, with no metrics scraper trimming it: median %s MiB, then %s MiB", mib(redisMem[0]), mib(redisMem[1]))
		}
	}
	if l.audited == 0 {
		t.Error("no abandoned lease was audited: the TTL check proved nothing")
	}
	if leftLeases != 0 {
		t.Errorf("%d leases still counted against proxies after every lease expired or was released", leftLeases)
	}
	if !sameProcess {
		t.Error("the operator restarted in the last half: its memory cannot be judged")
	}
	if rss[1] > rss[0]*flatRatio+flatRSSSlack {
		t.Errorf("operator memory grew over the last half: median %s MiB, then %s MiB", mib(rss[0]), mib(rss[1]))
	}
	if goroutines[1] > goroutines[0]*flatRatio+flatGoroutines {
		t.Errorf("operator goroutines grew over the last half: median %.0f, then %.0f", goroutines[0], goroutines[1])
	}
}

// leaveSomeDown kills a fixed handful of each kind of proxy at the end and
// leaves them down, so the verdict check has dead proxies to find whatever
// the random chaos did last.
func (c *chaos) leaveSomeDown() string {
	pods, vms := 0, 0
	for _, uid := range c.w.cluster.Runner.Pods() {
		addr := c.w.cluster.Runner.Addr(uid)
		if pods < 5 && c.w.cluster.Runner.KillSquid(uid) {
			c.hold(addr)
			pods++
		}
	}
	for vms < 5 {
		addr := []*cluster.VMRunner{c.w.vms, c.w.ec2VMs}[vms%2].Crash(c.rng.IntN)
		if addr == "" {
			break
		}
		c.hold(addr)
		vms++
	}
	c.w.squids[0].stop()
	return fmt.Sprintf("%d pod Squids, %d VM proxies, 1 External Squid", pods, vms)
}

// notReady lists the Proxies whose Ready condition is not True.
func (w *world) notReady(ctx context.Context) []string {
	var list crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, p := range list.Items {
		if !meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady) {
			out = append(out, p.Name+" not Ready")
		}
	}
	if len(list.Items) != total(sizes) {
		out = append(out, fmt.Sprintf("%d Proxies, want %d", len(list.Items), total(sizes)))
	}
	return out
}

// inventory lists what is wrong between the Proxies and the instances: a
// Proxy not provisioned at its current generation, a Proxy with no
// instance, two instances or the wrong address, an instance whose Proxy is
// gone. Instances being deleted are in flight, not leaked.
func (w *world) inventory(ctx context.Context) []string {
	c := w.cluster.Env.Client
	var proxies crawlv1alpha1.ProxyList
	var pods corev1.PodList
	if err := c.List(ctx, &proxies, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}
	}
	if err := c.List(ctx, &pods, client.HasLabels{crawlv1alpha1.LabelClusterID}); err != nil {
		return []string{err.Error()}
	}
	// Instance addresses by owner UID.
	addrs := map[types.UID][]string{}
	var problems []string
	own := func(uid, addr string) { addrs[types.UID(uid)] = append(addrs[types.UID(uid)], addr) }
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil {
			own(pod.Labels[crawlv1alpha1.LabelOwnerUID], pod.Status.PodIP)
		}
	}
	for _, vm := range w.fake.Instances() {
		if vm.GetStatus() != "STOPPING" {
			ip, _, _ := net.SplitHostPort(cluster.VMAddr(vm.GetNetworkInterfaces(), vm.GetLabels()["crawl-port"]))
			own(vm.GetLabels()["crawl-owner-uid"], ip)
		}
	}
	for _, in := range w.ec2.Instances() {
		if in.State != fakeec2.StateTerminated && in.State != fakeec2.StateShuttingDown {
			own(in.Tags[crawlv1alpha1.LabelOwnerUID], in.PublicIP)
		}
	}
	byUID := map[types.UID]bool{}
	for _, p := range proxies.Items {
		byUID[p.UID] = true
		provisioned := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
		switch {
		case p.DeletionTimestamp != nil:
			problems = append(problems, p.Name+": still being deleted")
			continue
		case provisioned == nil || provisioned.Status != "True" || provisioned.ObservedGeneration != p.Generation:
			problems = append(problems, p.Name+": not provisioned at its current generation")
			continue
		case p.Spec.Mode == crawlv1alpha1.ModeExternal:
			if len(addrs[p.UID]) > 0 {
				problems = append(problems, p.Name+": an External Proxy owns an instance")
			}
			continue
		}
		switch got := addrs[p.UID]; {
		case len(got) == 0:
			problems = append(problems, p.Name+": no instance")
		case len(got) > 1:
			problems = append(problems, fmt.Sprintf("%s: %d instances (duplicated)", p.Name, len(got)))
		case got[0] != p.Status.IP:
			problems = append(problems, fmt.Sprintf("%s: status says %s, its instance is at %s", p.Name, p.Status.IP, got[0]))
		}
	}
	for uid, a := range addrs {
		if !byUID[uid] {
			problems = append(problems, fmt.Sprintf("instance at %v leaked: its Proxy (uid %s) is gone", a, uid))
		}
	}
	slices.Sort(problems)
	return problems
}

// verdictCheck probes every Proxy through its own address, as the engine
// does, and lists where the Healthy condition or the discovery API says
// otherwise; it also counts the proxies our probe found down.
func (w *world) verdictCheck(ctx context.Context) ([]string, int) {
	var list crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}, 0
	}
	listed, err := w.discovered()
	if err != nil {
		return []string{err.Error()}, 0
	}
	reallyHealthy := make([]bool, len(list.Items))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range list.Items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			p := &list.Items[i]
			reallyHealthy[i] = w.probe(p.Status.IP, p.Status.Port, w.credentialsFor(ctx, p, listed[p.Namespace+"/"+p.Name]))
		})
	}
	wg.Wait()
	var problems []string
	down := 0
	for i, p := range list.Items {
		if !reallyHealthy[i] {
			down++
		}
		status := meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionHealthy)
		id := p.Namespace + "/" + p.Name
		if status != reallyHealthy[i] || listed[id].Healthy != reallyHealthy[i] {
			problems = append(problems, fmt.Sprintf("%s: really healthy %t, Healthy condition %t, discovery %t", id, reallyHealthy[i], status, listed[id].Healthy))
		}
	}
	return problems, down
}

// credentialsFor is what our probe of p presents: the credentials
// discovery lists for it (an External proxy's), or, for a Managed proxy
// that takes per-lease credentials, its own signed with its instance's
// record, as the health engine signs them.
func (w *world) credentialsFor(ctx context.Context, p *crawlv1alpha1.Proxy, listed listedProxy) *url.Userinfo {
	if user := listed.userinfo(); user != nil || p.Spec.Mode != crawlv1alpha1.ModeManaged {
		return user
	}
	var record corev1.Secret
	key := types.NamespacedName{Namespace: cluster.OperatorNamespace, Name: credentials.RecordName(p.Namespace, p.Status.SpecHash)}
	if err := w.cluster.Env.Client.Get(ctx, key, &record); err != nil {
		return nil
	}
	c, err := credentials.FromSecret(&record)
	if err == nil {
		c, err = c.SignedFor(p.Namespace+"/"+p.Name, "soak-probe", time.Now().Add(time.Minute))
	}
	if err != nil {
		return nil
	}
	return c.Userinfo()
}

// probe fetches the probe target through a proxy, with the credentials
// discovery handed out for it (nil for none), as a crawler would: true
// when it answers 2xx.
func (w *world) probe(ip string, port int32, user *url.Userinfo) bool {
	if ip == "" {
		return false
	}
	pem, err := os.ReadFile(w.cluster.Target.CAFile)
	if err != nil {
		return false
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	proxyURL := &url.URL{Scheme: "http", User: user, Host: net.JoinHostPort(ip, strconv.Itoa(int(port)))}
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
	}}
	res, err := c.Get(w.cluster.Target.URL)
	if err != nil {
		return false
	}
	_ = res.Body.Close()
	return res.StatusCode >= 200 && res.StatusCode < 300
}

// discovered is each proxy as the discovery API lists it, by ID.
func (w *world) discovered() (map[string]listedProxy, error) {
	proxies, err := w.listProxies()
	if err != nil {
		return nil, err
	}
	out := map[string]listedProxy{}
	for _, p := range proxies {
		out[p.ID] = p
	}
	return out, nil
}

// activeLeases adds up the leases the discovery API counts against proxies.
func (w *world) activeLeases() int {
	proxies, err := w.listProxies()
	if err != nil {
		return -1
	}
	n := 0
	for _, p := range proxies {
		n += p.ActiveLeases
	}
	return n
}

type listedProxy struct {
	ID           string `json:"id"`
	Healthy      bool   `json:"healthy"`
	ActiveLeases int    `json:"activeLeases"`
	Username     string `json:"username"`
	Password     string `json:"password"`
}

// userinfo is the proxy's credentials for a proxy URL, nil when discovery
// gave none.
func (p listedProxy) userinfo() *url.Userinfo {
	if p.Username == "" {
		return nil
	}
	return url.UserPassword(p.Username, p.Password)
}

func (w *world) listProxies() ([]listedProxy, error) {
	req, err := http.NewRequest(http.MethodGet, w.discoveryURL+"/v1/proxies", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("listing proxies: %w", err)
	}
	defer res.Body.Close()
	var body struct {
		Proxies []listedProxy `json:"proxies"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("listing proxies: %s: %w", res.Status, err)
	}
	return body.Proxies, nil
}

// sampler records the operator's memory and goroutines while it is up.
type sampler struct {
	w *world
	// redis reads the lease store's memory, with Redis.
	redis *redis.Client

	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at              time.Time
	pid             int
	rss, goroutines float64
	// redis is the lease store's memory (less the ledger), with Redis.
	redis float64
}

func (s *sampler) run(ctx context.Context) {
	ticker := time.NewTicker(sampleEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticker.C:
			if !s.w.operatorUp.Load() {
				continue
			}
			op := s.w.currentOperator()
			rss, err1 := cluster.ResidentBytes(op.PID())
			families, err2 := cluster.ScrapeMetrics("http://" + s.w.metricsAddr + "/metrics")
			if err1 != nil || err2 != nil || families["go_goroutines"] == nil || !s.w.operatorUp.Load() {
				continue // killed between the checks
			}
			g := families["go_goroutines"].GetMetric()[0].GetGauge().GetValue()
			x := sample{at: now, pid: op.PID(), rss: rss, goroutines: g}
			if s.redis != nil {
				if x.redis, err1 = redisMemory(ctx, s.redis); err1 != nil {
					continue
				}
			}
			s.mu.Lock()
			s.samples = append(s.samples, x)
			s.mu.Unlock()
		}
	}
}

// flatness splits the samples in [from, to] in two halves by time and
// returns each half's median RSS and goroutine count, and whether one
// process gave them all.
func (s *sampler) flatness(from, to time.Time) (rss, goroutines, redisMem [2]float64, sameProcess bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	mid := from.Add(to.Sub(from) / 2)
	var halves [2][]sample
	pids := map[int]bool{}
	for _, x := range s.samples {
		if x.at.Before(from) || x.at.After(to) {
			continue
		}
		pids[x.pid] = true
		h := 0
		if x.at.After(mid) {
			h = 1
		}
		halves[h] = append(halves[h], x)
	}
	for h := range halves {
		rss[h] = median(halves[h], func(x sample) float64 { return x.rss })
		goroutines[h] = median(halves[h], func(x sample) float64 { return x.goroutines })
		redisMem[h] = median(halves[h], func(x sample) float64 { return x.redis })
	}
	return rss, goroutines, redisMem, len(pids) == 1 && len(halves[0]) > 0 && len(halves[1]) > 0
}

func (s *sampler) count(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.samples {
		if !x.at.Before(from) && !x.at.After(to) {
			n++
		}
	}
	return n
}

func median(xs []sample, of func(sample) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = of(x)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// eventually polls check until it reports nothing or timeout passes, and
// returns what it last reported.
func eventually(timeout time.Duration, check func() []string) []string {
	deadline := time.Now().Add(timeout)
	for {
		problems := check()
		if len(problems) == 0 || time.Now().After(deadline) {
			return problems
		}
		time.Sleep(time.Second)
	}
}

// waitFor is eventually, failing the test on a timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, check func() []string) {
	t.Helper()
	if problems := eventually(timeout, check); len(problems) > 0 {
		t.Fatalf("%s: not within %s: %d problems, first: %s", what, timeout, len(problems), strings.Join(problems[:min(10, len(problems))], "; "))
	}
}

// report fails the test with the first few problems of a kind.
func report(t *testing.T, what string, problems []string) {
	t.Helper()
	if len(problems) > 0 {
		t.Errorf("%s: %d, first: %s", what, len(problems), strings.Join(problems[:min(10, len(problems))], "; "))
	}
}

func total(sizes map[string]int) int {
	n := 0
	for _, v := range sizes {
		n += v
	}
	return n
}

func mib(b float64) string { return strconv.FormatFloat(b/(1<<20), 'f', 1, 64) }

// totalReplacements adds the running operator's replacements to those of
// the processes the chaos killed.
func (w *world) totalReplacements() map[string]float64 {
	w.mu.Lock()
	total := maps.Clone(w.replacements)
	w.mu.Unlock()
	if now, err := w.replacementsNow(); err == nil {
		for cause, n := range now {
			total[cause] += n
		}
	}
	return total
}

func formatCauses(byCause map[string]float64) string {
	causes := slices.Sorted(maps.Keys(byCause))
	var b strings.Builder
	for _, c := range causes {
		fmt.Fprintf(&b, " %s %.0f,", c, byCause[c])
	}
	return strings.TrimSuffix(b.String(), ",")
}

// replicasFigure says how discovery's state was kept, and in the
// two-replica soak what the shared store kept through the kills.
func (w *world) replicasFigure(l *load) string {
	if w.second == nil {
		return "1 (memory lease store)"
	}
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return fmt.Sprintf("2 on a shared Redis, dividing the probing: %t; second replica killed %d times; leases lost before their TTL: %d; cooldowns forgotten: %d (leases checked against a reported cooldown: %d)",
		*soakShardProbes, w.second.killCount(), len(l.shared.lost), len(l.shared.forgotten), l.shared.checked)
}
