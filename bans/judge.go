package bans

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/operator"
)

// Memory is what the judge reads and writes of the outcome memory (the
// lease store's).
type Memory interface {
	Blocks(ctx context.Context, since time.Time) ([]lease.Block, error)
	BurnIP(ctx context.Context, scope, ip string, retention time.Duration) error
	MarkClientBan(ctx context.Context, host, client string, retention time.Duration) error
	EndCooldown(ctx context.Context, proxy, host string, notAfter time.Time) error
}

// Defaults of the judge's flags.
const (
	DefaultInterval        = 15 * time.Second
	DefaultMaxBlockedShare = 0.3
	DefaultBurnRetention   = 24 * time.Hour
)

// Event reasons the judge emits.
const (
	EventBanned      = "Banned"
	EventHostSuspect = "BlockingHostSuspect"
	EventClientBan   = "ClientFingerprintBanned"
)

// Options wire a Judge.
type Options struct {
	// Client reads Proxies and ProxyPools (from the cache) and applies the
	// Banned condition.
	Client   client.Client
	Memory   Memory
	Interval time.Duration
	// MaxBlockedShare: a host that blocked more than this share of a
	// group's serving proxies within the window (MinSuspectBlocked at
	// least) is suspect, and nobody is banned for it.
	MaxBlockedShare float64
	// BurnRetention is how long a banned proxy's exit IPs stay burned.
	BurnRetention time.Duration
	Recorder      events.EventRecorder
	Clock         clock.PassiveClock
	// Notify tells the Proxy reconciler of a new ban at once (nil: its
	// watch of the status does).
	Notify chan<- event.GenericEvent
	// ReportCooldown is the cooldown a blocked report starts (the
	// discovery API's --discovery-cooldown): a client ban ends those the
	// banned client's reports started.
	ReportCooldown time.Duration
}

// Judge passes judgement every Interval on the leader.
type Judge struct {
	opts Options

	mu sync.Mutex
	// suspected are the (group, host) pairs suspect at the last pass, so
	// the Event goes out once per suspicion.
	suspected map[string]bool
	// lastSuspect is when each (group, host) was last suspect (Decide's
	// pardon). It is the memory of an outage: lost on a restart, which
	// errs toward banning over keeping, as the Proxy reconciler's memory
	// of a probe target's outage does.
	lastSuspect map[string]time.Time
	// clientBanned are the client bans found at the last pass (keyed
	// group|host|client), so the Event goes out once per ban.
	clientBanned map[string]bool
}

// New returns a judge.
func New(opts Options) *Judge {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Judge{opts: opts, suspected: map[string]bool{}, lastSuspect: map[string]time.Time{}, clientBanned: map[string]bool{}}
}

// NeedLeaderElection is true: one judge writes the condition.
func (j *Judge) NeedLeaderElection() bool { return true }

// Start judges until ctx ends.
func (j *Judge) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("bans")
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := j.Pass(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "judging bans")
		}
	}, j.opts.Interval)
	return nil
}

// Pass judges once: it reads every Proxy and pool and the recent blocks,
// bans the subjects the verdicts say, clears bans of replaced instances,
// and tells of new suspect hosts.
func (j *Judge) Pass(ctx context.Context) error {
	now := j.opts.Clock.Now()
	// The cache's own objects, read only: a pass over a large fleet every
	// few seconds must not copy it.
	var proxies crawlv1alpha1.ProxyList
	if err := j.opts.Client.List(ctx, &proxies, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing Proxies: %w", err)
	}
	var pools crawlv1alpha1.ProxyPoolList
	if err := j.opts.Client.List(ctx, &pools, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing ProxyPools: %w", err)
	}
	poolOf := map[types.NamespacedName]*crawlv1alpha1.ProxyPool{}
	for i := range pools.Items {
		poolOf[client.ObjectKeyFromObject(&pools.Items[i])] = &pools.Items[i]
	}
	blocks, err := j.opts.Memory.Blocks(ctx, now.Add(-lease.OutcomeRetention))
	if err != nil {
		return fmt.Errorf("reading the outcome memory: %w", err)
	}
	var subjects []Subject
	byKey := map[types.NamespacedName]Subject{}
	for i := range proxies.Items {
		if s, ok := subjectOf(&proxies.Items[i], poolOf); ok {
			subjects = append(subjects, s)
			byKey[s.Key] = s
		}
	}
	j.mu.Lock()
	verdicts, suspects, clientBans := Decide(subjects, blocks, now, j.opts.MaxBlockedShare, j.lastSuspect)
	for _, s := range suspects {
		j.lastSuspect[SuspectKey(s.Group, s.Host)] = now
	}
	for k, at := range j.lastSuspect {
		if now.Sub(at) > lease.OutcomeRetention {
			delete(j.lastSuspect, k) // no block that old is left to pardon
		}
	}
	j.mu.Unlock()
	// Suspects are told last: their Event says the pass that spared the
	// proxies for them is over.
	defer j.tellSuspects(ctx, suspects, poolOf)
	var errs []error
	if err := j.markClientBans(ctx, clientBans, poolOf); err != nil {
		errs = append(errs, err)
	}
	for i := range proxies.Items {
		p := &proxies.Items[i]
		key := client.ObjectKeyFromObject(p)
		if s, judged := byKey[key]; judged {
			if v := verdicts[key]; v.Banned && p.CurrentBan() == nil {
				if err := j.ban(ctx, p, s, v); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if err := j.clearStale(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of the judge's writes failed, the first: %w", len(errs), errs[0])
	}
	return nil
}

// subjectOf is p as the judge sees it; ok is false for a proxy it does not
// judge (External, not serving).
func subjectOf(p *crawlv1alpha1.Proxy, poolOf map[types.NamespacedName]*crawlv1alpha1.ProxyPool) (Subject, bool) {
	if p.Spec.Mode != crawlv1alpha1.ModeManaged || !p.Serving() {
		return Subject{}, false
	}
	prov := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
	if prov == nil || prov.Status != metav1.ConditionTrue {
		return Subject{}, false
	}
	group := p.Namespace
	var pool *crawlv1alpha1.ProxyPool
	if name := p.PoolName(); name != "" {
		group += "/" + name
		pool = poolOf[types.NamespacedName{Namespace: p.Namespace, Name: name}]
	}
	hosts, window := p.BanPolicy(pool)
	return Subject{Key: client.ObjectKeyFromObject(p), Group: group, Hosts: hosts, Window: window, Since: prov.LastTransitionTime.Time}, true
}

// ban burns p's exit IPs, then applies its Banned condition: the burn
// first, so no successor comes up on them unnoticed; a burn that fails
// bans nothing this pass.
func (j *Judge) ban(ctx context.Context, p *crawlv1alpha1.Proxy, s Subject, v Verdict) error {
	scope := p.Status.Provider
	if scope == "" {
		scope = p.Spec.Provider
	}
	ips := exitIPs(p)
	for _, ip := range ips {
		if err := j.opts.Memory.BurnIP(ctx, scope, ip, j.opts.BurnRetention); err != nil {
			return fmt.Errorf("burning %s of Proxy %s/%s: %w", ip, p.Namespace, p.Name, err)
		}
	}
	msg := fmt.Sprintf("blocked by %d hosts within %s: %s", len(v.Hosts), s.Window, strings.Join(v.Hosts, ", "))
	cond := metav1.Condition{Type: crawlv1alpha1.ConditionBanned, Status: metav1.ConditionTrue, ObservedGeneration: p.Generation,
		LastTransitionTime: metav1.NewTime(j.opts.Clock.Now()), Reason: crawlv1alpha1.ReasonBlockedOnHosts, Message: msg}
	if err := j.apply(ctx, p, cond, p.Status.Instance()); err != nil {
		return err
	}
	bansTotal.WithLabelValues(scope).Inc()
	logf.FromContext(ctx).Info("proxy banned", "proxy", client.ObjectKeyFromObject(p), "hosts", v.Hosts, "ips", ips)
	if j.opts.Recorder != nil {
		j.opts.Recorder.Eventf(p, nil, corev1.EventTypeWarning, EventBanned, "Judge", "%s; its exit IPs %s are burned for %s", msg,
			strings.Join(ips, ", "), j.opts.BurnRetention)
	}
	if j.opts.Notify != nil {
		select {
		case j.opts.Notify <- event.GenericEvent{Object: p}:
		case <-ctx.Done():
		}
	}
	return nil
}

// clearStale turns a Banned condition about a replaced instance False: a
// ban of an earlier instance is no ban of this one.
func (j *Judge) clearStale(ctx context.Context, p *crawlv1alpha1.Proxy) error {
	c := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionBanned)
	if c == nil || c.Status != metav1.ConditionTrue || p.Status.BannedInstance == p.Status.Instance() {
		return nil
	}
	return j.apply(ctx, p, metav1.Condition{Type: crawlv1alpha1.ConditionBanned, Status: metav1.ConditionFalse, ObservedGeneration: p.Generation,
		LastTransitionTime: metav1.NewTime(j.opts.Clock.Now()), Reason: "InstanceReplaced",
		Message: "the banned instance " + p.Status.BannedInstance + " was replaced"}, "")
}

func (j *Judge) apply(ctx context.Context, p *crawlv1alpha1.Proxy, c metav1.Condition, instance string) error {
	cfg := acv1alpha1.Proxy(p.Name, p.Namespace).WithStatus(acv1alpha1.ProxyStatus().
		WithBannedInstance(instance).WithConditions(crawlv1alpha1.ConditionApply(c)))
	if err := j.opts.Client.Status().Apply(ctx, cfg, client.FieldOwner(crawlv1alpha1.FieldManagerBans), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the Banned condition of Proxy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// exitIPs are the addresses sites saw p's requests come from: its IP, its
// egress IP when the probe learned another, and the first address of its
// IPv6 range (the memory burns each one's sender: the range's /64).
func exitIPs(p *crawlv1alpha1.Proxy) []string {
	ips := []string{p.Status.IP}
	if e := p.Status.EgressIP; e != "" && e != p.Status.IP {
		ips = append(ips, e)
	}
	if a := netid.RangeAddr(p.Status.IPv6Prefix); a != "" {
		ips = append(ips, a)
	}
	return ips
}

// tellSuspects sets the gauge and sends an Event to a pool the first pass
// one of its hosts is suspect.
func (j *Judge) tellSuspects(ctx context.Context, suspects []Suspect, poolOf map[types.NamespacedName]*crawlv1alpha1.ProxyPool) {
	suspectHosts.Set(float64(len(suspects)))
	j.mu.Lock()
	defer j.mu.Unlock()
	now := map[string]bool{}
	for _, s := range suspects {
		k := SuspectKey(s.Group, s.Host)
		now[k] = true
		if j.suspected[k] {
			continue
		}
		logf.FromContext(ctx).Info("blocking host suspect: nobody is banned for it", "group", s.Group, "host", s.Host, "blocked", s.Blocked, "serving", s.Serving)
		if pool := poolOfGroup(s.Group, poolOf); pool != nil && j.opts.Recorder != nil {
			j.opts.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, EventHostSuspect, "Judge",
				"host %s blocked %d of the %d serving members at once: suspecting the host, not the members; none is recycled for it",
				s.Host, s.Blocked, s.Serving)
		}
	}
	j.suspected = now
}

// poolOfGroup is the ProxyPool a judged group names (namespace/pool), nil
// for a namespace's stand-alone Proxies or a pool gone.
func poolOfGroup(group string, poolOf map[types.NamespacedName]*crawlv1alpha1.ProxyPool) *crawlv1alpha1.ProxyPool {
	ns, name, isPool := strings.Cut(group, "/")
	if !isPool {
		return nil
	}
	return poolOf[types.NamespacedName{Namespace: ns, Name: name}]
}

// markClientBans marks each host that bans a client (MarkClientBans) and
// sets the gauge; a pool hears of each new one by an Event.
func (j *Judge) markClientBans(ctx context.Context, found []ClientBan, poolOf map[types.NamespacedName]*crawlv1alpha1.ProxyPool) error {
	clientBansGauge.Set(float64(len(found)))
	err := MarkClientBans(ctx, j.opts.Memory, found, j.opts.Clock.Now(), j.opts.ReportCooldown)
	now := map[string]bool{}
	for _, cb := range found {
		k := cb.Group + "|" + cb.Host + "|" + cb.Client
		now[k] = true
		if j.clientBanned[k] {
			continue
		}
		logf.FromContext(ctx).Info("host bans a client, not the proxies: nobody is banned for it", "group", cb.Group, "host", cb.Host,
			"client", cb.Client, "blocked", cb.Blocked, "passed", cb.Passed)
		if pool := poolOfGroup(cb.Group, poolOf); pool != nil && j.opts.Recorder != nil {
			j.opts.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, EventClientBan, "Judge",
				"host %s blocks the TLS client %s through %d members while other clients pass through %d of them: the client's fingerprint is banned, not the members; none is recycled for it",
				cb.Host, cb.Client, cb.Blocked, cb.Passed)
		}
	}
	j.mu.Lock()
	j.clientBanned = now
	j.mu.Unlock()
	return err
}

// MarkClientBans marks, in the outcome memory, each host that bans a
// client, for every replica's gateway to tell the client and its reports
// to cool nothing more, and ends the cooldowns the client's blocks put on
// the proxies (those ending within reportCooldown of now: a site's longer
// Retry-After stays).
func MarkClientBans(ctx context.Context, memory Memory, found []ClientBan, now time.Time, reportCooldown time.Duration) error {
	var errs []error
	for _, cb := range found {
		if err := memory.MarkClientBan(ctx, cb.Host, cb.Client, lease.OutcomeRetention); err != nil {
			errs = append(errs, fmt.Errorf("marking %s's ban of client %s: %w", cb.Host, cb.Client, err))
			continue
		}
		for _, proxy := range cb.Proxies {
			if err := memory.EndCooldown(ctx, proxy, cb.Host, now.Add(reportCooldown)); err != nil {
				errs = append(errs, fmt.Errorf("ending the cooldown of %s for %s: %w", proxy, cb.Host, err))
			}
		}
	}
	return errors.Join(errs...)
}

var (
	clientBansGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "bans", Name: "client_bans",
		Help: "Hosts found at the last pass blocking one TLS client fingerprint through a pool's members while other clients pass: nobody is banned for them.",
	})
	bansTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "bans", Name: "total",
		Help: "Proxies the ban judge found blocked on enough hosts (their exit IPs burned), by provider instance.",
	}, []string{"provider"})
	suspectHosts = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: operator.MetricsNamespace, Subsystem: "bans", Name: "suspect_hosts",
		Help: "Hosts that blocked more than --max-blocked-share of one pool (or namespace) at the last pass: suspected, so nobody is banned for them.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(bansTotal, suspectHosts, clientBansGauge)
}

// Config is the judge's flags.
type Config struct {
	Interval        time.Duration
	MaxBlockedShare float64
	BurnRetention   time.Duration
}

// AddFlags registers the judge's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Interval, "ban-check-interval", DefaultInterval,
		"How often the ban judge reads the outcome memory and bans the proxies blocked on enough hosts (spec.banRecycling).")
	fs.Float64Var(&c.MaxBlockedShare, "max-blocked-share", DefaultMaxBlockedShare,
		"When one host blocked more than this share (0-1] of a pool's serving members (of a namespace's stand-alone Proxies) within the window, 3 at least, the host is suspected, not the proxies: nobody is banned for it.")
	fs.DurationVar(&c.BurnRetention, "burned-ip-retention", DefaultBurnRetention,
		"How long the exit IPs of a proxy banned by the sites are remembered per provider instance: an instance that comes up on one is replaced before it serves.")
}

// Validate checks the judge's flags.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval < time.Second {
		errs = append(errs, fmt.Errorf("--ban-check-interval must be at least 1s, got %s", c.Interval))
	}
	if !(c.MaxBlockedShare > 0 && c.MaxBlockedShare <= 1) {
		errs = append(errs, fmt.Errorf("--max-blocked-share must be a share in (0, 1], got %g", c.MaxBlockedShare))
	}
	if c.BurnRetention < time.Minute {
		errs = append(errs, fmt.Errorf("--burned-ip-retention must be at least 1m, got %s", c.BurnRetention))
	}
	return errors.Join(errs...)
}
