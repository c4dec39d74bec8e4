//go:build soak

package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/test/cluster"
)

// The self-healing faults and their timing.
const (
	// outageLength is how long the probe target is down: longer than the
	// replacement period, so a mass replacement would show.
	outageLength = 45 * time.Second
	// sickQuiet: no proxy is left sick this long before the outage (its
	// own replacement would be due inside it) or before the end (it must
	// be replaced by then).
	sickQuiet = replaceAfter + 60*time.Second
	// outageSettle covers the probes after the target is back.
	outageSettle = 2*healthInterval + 5*time.Second
	// outageJudgedFrom: replacements due to faults from before the outage
	// may still land in its first seconds; from here on, any replacement
	// for being Unhealthy is one the outage caused.
	outageJudgedFrom = (failureThreshold+2)*healthInterval + 5*time.Second
)

// outagePhase is the probe target's outage and what the operator replaced
// (and held) during it.
type outagePhase struct {
	start, end                  time.Time
	began, judging, ended, over bool
	replacedBefore              float64
	replacedDuring              float64
	heldBefore, heldDuring      float64
	errs                        []string
}

// outageStep moves the outage along: down at start, the counters read once
// the fleet has failed, up at end, the counters read once the probes after
// it have settled.
func (c *chaos) outageStep(now time.Time) {
	o := &c.outage
	if o.start.IsZero() || o.over {
		return
	}
	switch {
	case !o.began && !now.Before(o.start):
		o.began = true
		c.w.cluster.Target.SetDown(true)
		c.count("probe target down (outage phase)")
	case o.began && !o.judging && now.After(o.start.Add(outageJudgedFrom)):
		o.judging = true
		o.replacedBefore, o.heldBefore = c.outageCounters()
	case o.began && !o.ended && !now.Before(o.end):
		o.ended = true
		c.w.cluster.Target.SetDown(false)
		c.count("probe target back")
	case o.ended && now.After(o.end.Add(replaceAfter+outageSettle)):
		o.over = true
		replaced, held := c.outageCounters()
		o.replacedDuring, o.heldDuring = replaced-o.replacedBefore, held-o.heldBefore
	}
}

// endOutage brings the probe target back if the run ends during the
// outage; the phase then stays unjudged, and the run says so.
func (c *chaos) endOutage() {
	if o := &c.outage; o.began && !o.ended {
		o.ended = true
		c.w.cluster.Target.SetDown(false)
		c.count("probe target back (run ended during the outage)")
	}
}

func (c *chaos) outageCounters() (replaced, held float64) {
	r, err := c.w.replacementsNow()
	if err != nil {
		c.outage.errs = append(c.outage.errs, "reading replacements: "+err.Error())
	}
	h, err := metricByLabel(c.w.metricsAddr, "proxy_operator_replacements_held_total", "reason")
	if err != nil {
		c.outage.errs = append(c.outage.errs, "reading held replacements: "+err.Error())
	}
	if h == nil {
		h = map[string]float64{}
	}
	if c.w.second != nil { // whichever replica leads holds them back
		h2, err := metricByLabel(c.w.second.metricsAddr, "proxy_operator_replacements_held_total", "reason")
		if err != nil {
			c.outage.errs = append(c.outage.errs, "reading the second replica's held replacements: "+err.Error())
		}
		h["ProbeTargetSuspect"] += h2["ProbeTargetSuspect"]
	}
	// Pool members Unhealthy too long are replaced by their pool.
	return r["UnhealthyTooLong"] + r[poolCause("UnhealthyTooLong")], h["ProbeTargetSuspect"]
}

func (c *chaos) hold(addr string) {
	if addr == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held[addr]++
}

func (c *chaos) unhold(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[addr]--; c.held[addr] <= 0 {
		delete(c.held, addr)
	}
}

// heldDown says whether the chaos keeps addr down now.
func (c *chaos) heldDown(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[addr] > 0
}

func (c *chaos) runningVMs() []string {
	var running []string
	for _, vm := range c.w.fake.Instances() {
		if vm.GetStatus() == "RUNNING" {
			running = append(running, vm.GetName())
		}
	}
	return running
}

// pickInstance notes the death of a running EC2 instance picked at random
// and returns its id.
func (c *chaos) pickInstance() (string, bool) {
	var running []fakeec2.Instance
	for _, in := range c.w.ec2.Instances() {
		if in.State == fakeec2.StateRunning {
			running = append(running, in)
		}
	}
	if len(running) == 0 {
		return "", false
	}
	in := running[c.rng.IntN(len(running))]
	c.mu.Lock()
	c.deaths = append(c.deaths, vmDeath{cloud: "aws", proxy: in.Tags[crawlv1alpha1.LabelOwnerName], oldIP: in.PublicIP, at: time.Now()})
	c.mu.Unlock()
	return in.ID, true
}

// deleteVM deletes a running VM behind the operator's back, as a console
// user or a preempted Spot VM would, or interrupts a Spot instance (EC2
// terminates it): no watch tells the operator, only its instance
// watcher's List.
func (c *chaos) deleteVM() {
	if c.rng.IntN(2) == 0 {
		if id, ok := c.pickInstance(); ok {
			c.w.ec2.Interrupt(id)
			c.count("EC2 Spot instance interrupted")
		}
		return
	}
	running := c.runningVMs()
	if len(running) == 0 {
		return
	}
	name := running[c.rng.IntN(len(running))]
	c.noteDeath(name)
	if c.w.fake.Remove(gcpZone, name) {
		c.count("VM deleted behind the operator's back")
	}
}

// deletePod deletes a proxy pod behind the operator's back.
func (c *chaos) deletePod(ctx context.Context) {
	var pods corev1.PodList
	if err := c.w.cluster.Env.Client.List(ctx, &pods, client.InNamespace(namespace), client.HasLabels{crawlv1alpha1.LabelClusterID}); err != nil {
		c.fail("listing pods: %v", err)
		return
	}
	if len(pods.Items) == 0 {
		return
	}
	pod := &pods.Items[c.rng.IntN(len(pods.Items))]
	if err := c.w.cluster.Env.Client.Delete(ctx, pod); err != nil {
		return // gone already
	}
	c.count("pod deleted behind the operator's back")
}

// sicken kills a Managed proxy's Squid for good, in a pod or on a VM: the
// instance runs and never serves again, so only replacement for being
// Unhealthy heals it.
func (c *chaos) sicken() {
	c.mu.Lock()
	allowed := c.sickAllowed
	c.mu.Unlock()
	if !allowed {
		return
	}
	if c.rng.IntN(2) == 0 {
		uids := c.w.cluster.Runner.Pods()
		if len(uids) > 0 && c.w.cluster.Runner.KillSquid(uids[c.rng.IntN(len(uids))]) {
			c.count("pod Squid killed for good (replaced when Unhealthy too long)")
		}
		return
	}
	if c.anyCloud().Crash(c.rng.IntN) != "" {
		c.count("VM proxy killed for good (replaced when Unhealthy too long)")
	}
}

// vmDeath is a VM the chaos killed, whose Proxy should come back Healthy
// on a new address.
type vmDeath struct {
	cloud string
	proxy string
	oldIP string
	at    time.Time
}

func (c *chaos) noteDeath(vmName string) {
	for _, vm := range c.w.fake.Instances() {
		if vm.GetName() != vmName {
			continue
		}
		ip, _, _ := net.SplitHostPort(cluster.VMAddr(vm.GetNetworkInterfaces(), vm.GetLabels()["crawl-port"]))
		c.mu.Lock()
		c.deaths = append(c.deaths, vmDeath{cloud: "gcp", proxy: vm.GetLabels()["crawl-owner-name"], oldIP: ip, at: time.Now()})
		c.mu.Unlock()
		return
	}
}

// trackRecoveries measures, for each VM the chaos killed, the time until its
// Proxy is Ready and Healthy on a new address. A Proxy deleted meanwhile (by
// churn) is dropped.
func (c *chaos) trackRecoveries(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		var list crawlv1alpha1.ProxyList
		if err := c.w.cluster.Env.Client.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
			continue
		}
		byName := map[string]*crawlv1alpha1.Proxy{}
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		now := time.Now()
		c.mu.Lock()
		c.deaths = slices.DeleteFunc(c.deaths, func(d vmDeath) bool {
			p, ok := byName[d.proxy]
			switch {
			case !ok:
				return true
			case p.Status.IP != "" && p.Status.IP != d.oldIP &&
				meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady):
				c.recoveries[d.cloud] = append(c.recoveries[d.cloud], now.Sub(d.at))
				return true
			}
			return false
		})
		c.mu.Unlock()
	}
}

// recoveryTimes are the median and the longest time from the death of a
// VM of cloud to its successor being Healthy, and how many are still
// waiting.
func (c *chaos) recoveryTimes(cloud string) (median, longest time.Duration, n, waiting int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := slices.Clone(c.recoveries[cloud])
	slices.Sort(r)
	if len(r) > 0 {
		median, longest = r[len(r)/2], r[len(r)-1]
	}
	for _, d := range c.deaths {
		if d.cloud == cloud {
			waiting++
		}
	}
	return median, longest, len(r), waiting
}

// unrecovered lists the Managed Proxies that are not Ready and Healthy,
// apart from those the chaos holds down at this moment, which it counts.
func (w *world) unrecovered(ctx context.Context, c *chaos) (problems []string, held int) {
	var list crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return []string{err.Error()}, 0
	}
	for _, p := range list.Items {
		if p.Spec.Mode != crawlv1alpha1.ModeManaged ||
			meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady) {
			continue
		}
		if c.heldDown(net.JoinHostPort(p.Status.IP, strconv.Itoa(int(p.Status.Port)))) {
			held++
			continue
		}
		problems = append(problems, p.Name+" ("+string(p.Status.Phase)+"): "+p.Status.Message)
	}
	slices.Sort(problems)
	return problems, held
}

// gcAudit reads every operator process's log for the instances orphan GC
// deleted, and lists those whose owning Proxy still exists: a live
// instance GC must never touch.
func (w *world) gcAudit(ctx context.Context) (deleted int, live []string, err error) {
	var list crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0, nil, err
	}
	owners := map[string]string{}
	for _, p := range list.Items {
		owners[string(p.UID)] = p.Name
	}
	w.mu.Lock()
	logs := slices.Clone(w.logs)
	w.mu.Unlock()
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, nil, err
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			var entry struct {
				Msg      string `json:"msg"`
				Instance string `json:"instance"`
				Provider string `json:"provider"`
				OwnerUID string `json:"ownerUID"`
				DryRun   bool   `json:"dryRun"`
			}
			if !strings.Contains(line, `"orphaned instance"`) || json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "orphaned instance" || entry.DryRun {
				continue
			}
			deleted++
			if name, ok := owners[entry.OwnerUID]; ok {
				live = append(live, fmt.Sprintf("%s's instance %s (provider %s)", name, entry.Instance, entry.Provider))
			}
		}
	}
	return deleted, live, nil
}

// logLinesAbout is the last n lines of the operator's logs (every process)
// that mention name: the story of a Proxy the checks found wrong, kept
// before the test's directory goes.
func (w *world) logLinesAbout(name string, n int) []string {
	w.mu.Lock()
	logs := slices.Clone(w.logs)
	w.mu.Unlock()
	var lines []string
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if strings.Contains(line, `"`+name+`"`) || strings.Contains(line, "/"+name+`"`) {
				lines = append(lines, line)
			}
		}
	}
	return lines[max(0, len(lines)-n):]
}
