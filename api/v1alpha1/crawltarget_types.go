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
	// the host in any window of interval, 1-10000: a hard bound, as a
	// site's sliding or fixed window counts, whatever the window's start.
	// The fleet spaces an IP's requests evenly, keeping 5% of the interval
	// (at most 100ms) for the network's jitter.
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

	// burst reads the policy as a token bucket instead, for sites that
	// count one: an idle IP may send this many at once, 1-10000, then
	// requestsPerInterval per interval on average, so up to burst +
	// requestsPerInterval may fall in one window. The fleet keeps one of
	// them in reserve for the network's jitter. Unset (the default): the
	// window bound of requestsPerInterval.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Burst *int32 `json:"burst,omitempty"`

	// countBy is what the site counts the numbers by: IP (each proxy IP,
	// the default) or Network (each /24 of IPv4 and /64 of IPv6: the
	// proxies whose exit IPs share one share requestsPerInterval, as a
	// site that limits by network sees them).
	// +optional
	// +kubebuilder:default=IP
	// +kubebuilder:validation:Enum=IP;Network
	CountBy string `json:"countBy,omitempty"`

	// maxConcurrentPerIP bounds each IP's open connections (leases,
	// tunnels) to the host, 1-1000. Unset: no bound.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentPerIP *int32 `json:"maxConcurrentPerIP,omitempty"`

	// fleetRequestsPerInterval caps the requests to the host in any window
	// of interval across every proxy of the namespace, 1-1000000 (with
	// burst set, a token bucket of that many). Unset: no cap beyond the
	// per-IP one.
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

// What a CrawlTarget's numbers are counted by (spec.countBy).
const (
	CountByIP      = "IP"
	CountByNetwork = "Network"
)

// The CrawlTarget's condition and its reasons.
const (
	ConditionAccepted = "Accepted"
	// ReasonAccepted: the policy is in force.
	ReasonAccepted = "Accepted"
	// ReasonConflict: an older CrawlTarget of the namespace names the
	// same host, and it is in force instead.
	ReasonConflict = "Conflict"
)

// Window is the interval the policy's numbers are counted over (1s when
// unset).
func (c *CrawlTarget) Window() time.Duration {
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
