package v1alpha1

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CrawlTargetSpec is a crawler team's politeness toward one host: how
// often each of its namespace's proxy IPs may send it a request, how many
// connections each may hold to it at once, and a cap for the whole fleet.
// Discovery and the gateway keep it together, on every replica.
type CrawlTargetSpec struct {
	// host is the site's host name (shop.example.com) or a wildcard domain
	// (*.example.com: every host below example.com, not example.com
	// itself), lower case. A wildcard needs at least two labels after
	// "*.", so it never matches every host of a top-level domain.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')",message="spec.host must be a lower-case host name such as shop.example.com, or a wildcard domain such as *.example.com"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('*.') || self.substring(2).contains('.')",message="spec.host: a wildcard must name a domain of at least two labels (*.example.com), not a top-level domain"
	Host string `json:"host"`

	// requestsPerInterval is how many requests each proxy IP may send to
	// the host per interval, on average, 1-10000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	RequestsPerInterval int32 `json:"requestsPerInterval"`

	// interval is the period requestsPerInterval is counted over, 1ms to
	// 24h.
	// +optional
	// +kubebuilder:default="1s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('24h')",message="spec.interval must be a duration from 1ms to 24h"
	Interval metav1.Duration `json:"interval,omitempty"`

	// burst is how many requests an idle IP may send at once, 1-10000
	// (default: requestsPerInterval). The fleet keeps one of them in
	// reserve for the network's jitter.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Burst *int32 `json:"burst,omitempty"`

	// maxConcurrentPerIP bounds each IP's open connections (leases,
	// tunnels) to the host, 1-1000. Unset: no bound.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentPerIP *int32 `json:"maxConcurrentPerIP,omitempty"`

	// fleetRequestsPerInterval caps the requests to the host per interval
	// across every proxy of the namespace, 1-1000000. Unset: no cap
	// beyond the per-IP one.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	FleetRequestsPerInterval *int32 `json:"fleetRequestsPerInterval,omitempty"`
}

// CrawlTargetStatus says whether the policy is in force.
type CrawlTargetStatus struct {
	// conditions: Accepted is True while the policy is in force; False
	// with reason Conflict when an older CrawlTarget of the namespace
	// names the same host (the oldest wins, then the first by name). A
	// CrawlTarget in a namespace no operator watches has no conditions.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CrawlTarget is a crawler team's politeness toward one host.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=ctg,categories=crawl
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.spec.host`
// +kubebuilder:printcolumn:name="Per IP",type=integer,JSONPath=`.spec.requestsPerInterval`
// +kubebuilder:printcolumn:name="Interval",type=string,JSONPath=`.spec.interval`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CrawlTarget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CrawlTargetSpec   `json:"spec"`
	Status CrawlTargetStatus `json:"status,omitempty"`
}

// CrawlTargetList is a list of CrawlTargets.
//
// +kubebuilder:object:root=true
type CrawlTargetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CrawlTarget `json:"items"`
}

// The CrawlTarget's condition and its reasons.
const (
	ConditionAccepted = "Accepted"
	// ReasonAccepted: the policy is in force.
	ReasonAccepted = "Accepted"
	// ReasonConflict: an older CrawlTarget of the namespace names the
	// same host, and it is in force instead.
	ReasonConflict = "Conflict"
)

// PerIPInterval is the time between two requests of one IP on average.
func (c *CrawlTarget) PerIPInterval() time.Duration {
	return c.interval() / time.Duration(max(c.Spec.RequestsPerInterval, 1))
}

// BurstPerIP is how many requests an idle IP may send at once.
func (c *CrawlTarget) BurstPerIP() int {
	if c.Spec.Burst != nil && *c.Spec.Burst >= 1 {
		return int(*c.Spec.Burst)
	}
	return int(max(c.Spec.RequestsPerInterval, 1))
}

// FleetInterval is the time between two requests of the whole fleet on
// average (zero: no fleet cap), and FleetBurst how many it may send at once.
func (c *CrawlTarget) FleetInterval() (time.Duration, int) {
	if c.Spec.FleetRequestsPerInterval == nil || *c.Spec.FleetRequestsPerInterval < 1 {
		return 0, 0
	}
	n := *c.Spec.FleetRequestsPerInterval
	return c.interval() / time.Duration(n), int(n)
}

func (c *CrawlTarget) interval() time.Duration {
	if c.Spec.Interval.Duration <= 0 {
		return time.Second
	}
	return c.Spec.Interval.Duration
}

// Matches says whether the policy's host covers host (lower case, no
// port), and how specifically: an exact host beats any wildcard, a longer
// wildcard a shorter one; 0 when it does not match.
func (c *CrawlTarget) Matches(host string) int {
	pattern := c.Spec.Host
	if domain, ok := strings.CutPrefix(pattern, "*."); ok {
		if strings.HasSuffix(host, "."+domain) {
			return len(domain)
		}
		return 0
	}
	if pattern == host {
		return 1 << 16 // beyond any wildcard's length
	}
	return 0
}

// Precedes says whether c wins over other, a CrawlTarget of the same
// namespace naming the same host: the older one, then the first by name.
// The one rule the index and the status both apply.
func (c *CrawlTarget) Precedes(other *CrawlTarget) bool {
	if !c.CreationTimestamp.Equal(&other.CreationTimestamp) {
		return c.CreationTimestamp.Before(&other.CreationTimestamp)
	}
	return c.Name < other.Name
}
