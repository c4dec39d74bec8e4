package broker

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	toolscache "k8s.io/client-go/tools/cache"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/feed"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// PolicyIndex is the CrawlTargets the manager's cache holds, by namespace:
// the declared Policies discovery and the gateway keep. An informer feeds
// it (Handler), as it feeds the View.
type PolicyIndex struct {
	mu   sync.RWMutex
	byNS map[string]map[string]*crawlv1alpha1.CrawlTarget // namespace -> name ->
}

var _ Policies = (*PolicyIndex)(nil)

// NewPolicyIndex returns an empty index.
func NewPolicyIndex() *PolicyIndex {
	return &PolicyIndex{byNS: map[string]map[string]*crawlv1alpha1.CrawlTarget{}}
}

// Handler is the informer handler that keeps the index current.
func (x *PolicyIndex) Handler() toolscache.ResourceEventHandler {
	return feed.Handler(x.upsert, func(c *crawlv1alpha1.CrawlTarget) {
		x.mu.Lock()
		defer x.mu.Unlock()
		delete(x.byNS[c.Namespace], c.Name)
		if len(x.byNS[c.Namespace]) == 0 {
			delete(x.byNS, c.Namespace)
		}
	})
}

func (x *PolicyIndex) upsert(c *crawlv1alpha1.CrawlTarget) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byNS[c.Namespace] == nil {
		x.byNS[c.Namespace] = map[string]*crawlv1alpha1.CrawlTarget{}
	}
	x.byNS[c.Namespace][c.Name] = c
}

// For is the policy for host among namespace's (false: none): the most
// specific CrawlTarget that covers host (an exact host, then the longest
// wildcard); of two naming the same host, the one that precedes (the
// older, then by name).
func (x *PolicyIndex) For(namespace, host string) (Policy, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var best *crawlv1alpha1.CrawlTarget
	bestScore := 0
	for _, c := range x.byNS[namespace] {
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		score := c.Matches(host)
		if score > 0 && (score > bestScore || (score == bestScore && c.Precedes(best))) {
			best, bestScore = c, score
		}
	}
	if best == nil {
		return Policy{}, false
	}
	return PolicyOf(best), true
}

// ForHost implements Policies: the policy for host in each namespace that
// has one, by namespace.
func (x *PolicyIndex) ForHost(host string) []Policy {
	x.mu.RLock()
	namespaces := make([]string, 0, len(x.byNS))
	for ns := range x.byNS {
		namespaces = append(namespaces, ns)
	}
	x.mu.RUnlock()
	slices.Sort(namespaces)
	var out []Policy
	for _, ns := range namespaces {
		if p, ok := x.For(ns, host); ok {
			out = append(out, p)
		}
	}
	return out
}

// exactHosts are the hosts the policies name without a wildcard: the
// bounded set the learned-pace metric reports on.
func (x *PolicyIndex) exactHosts() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []string
	for _, byName := range x.byNS {
		for _, c := range byName {
			if !strings.HasPrefix(c.Spec.Host, "*.") && !slices.Contains(out, c.Spec.Host) {
				out = append(out, c.Spec.Host)
			}
		}
	}
	slices.Sort(out)
	return out
}

// PolicyOf is a CrawlTarget as the pace the store keeps: its numbers as
// bounds over any window of its interval (lease.WindowPace), per IP and
// for the fleet; or, with spec.burst, the token bucket it asks for.
func PolicyOf(c *crawlv1alpha1.CrawlTarget) Policy {
	name, window := c.Namespace+"/"+c.Name, c.Window()
	n := int(max(c.Spec.RequestsPerInterval, 1))
	p := Policy{Name: name, Host: c.Spec.Host, Pace: lease.Pace{Interval: lease.WindowPace(n, window), Burst: 1},
		ByNetwork: c.Spec.CountBy == crawlv1alpha1.CountByNetwork}
	if c.Spec.Burst != nil {
		p.Pace.Interval, p.Pace.Burst = window/time.Duration(n), int(max(*c.Spec.Burst, 1))
	}
	if c.Spec.MaxConcurrentPerIP != nil {
		p.Pace.MaxConcurrent = int(*c.Spec.MaxConcurrentPerIP)
	}
	if f := c.Spec.FleetRequestsPerInterval; f != nil && *f >= 1 {
		p.Pace.FleetKey, p.Pace.FleetInterval, p.Pace.FleetBurst = name, lease.WindowPace(int(*f), window), 1
		if c.Spec.Burst != nil {
			p.Pace.FleetInterval, p.Pace.FleetBurst = window/time.Duration(*f), int(*f)
		}
	}
	return p
}

// learnedDesc is the learned pace of the hosts policies name.
var learnedDesc = prometheus.NewDesc(prometheus.BuildFQName(operator.MetricsNamespace, "", "target_learned_interval_seconds"),
	"The per-IP interval a host's push-backs taught, for the hosts CrawlTargets name (0: none learned).", []string{"host"}, nil)

// LearnedPaceCollector reports the learned pace of every host a policy
// names exactly, read from the store at scrape time (bounded by timeout):
// the policies bound the metric's cardinality.
func (b *Broker) LearnedPaceCollector(index *PolicyIndex, timeout time.Duration) prometheus.Collector {
	return &learnedCollector{b: b, index: index, timeout: timeout}
}

type learnedCollector struct {
	b       *Broker
	index   *PolicyIndex
	timeout time.Duration
}

func (c *learnedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- learnedDesc }

func (c *learnedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	for _, host := range c.index.exactHosts() {
		l, err := c.b.store.LearnedPace(ctx, host)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(learnedDesc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(learnedDesc, prometheus.GaugeValue, l.Interval.Seconds(), host)
	}
}
