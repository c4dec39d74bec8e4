package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyMode says who owns a proxy's lifecycle.
// +kubebuilder:validation:Enum=Managed;External
type ProxyMode string

const (
	// ModeManaged proxies are created, replaced and deleted by the operator
	// through a provider instance.
	ModeManaged ProxyMode = "Managed"
	// ModeExternal proxies run elsewhere; the operator only tracks and
	// health-checks them.
	ModeExternal ProxyMode = "External"
)

// ProxyPhase is a one-word summary of where a proxy is in its lifecycle. The
// conditions carry the detail; the phase is for humans and printer columns.
// +kubebuilder:validation:Enum=Pending;Provisioning;Ready;Replacing;Deleting;Failed
type ProxyPhase string

const (
	// PhasePending means accepted, nothing requested from a provider yet.
	PhasePending ProxyPhase = "Pending"
	// PhaseProvisioning means the instance is being created and is not running yet.
	PhaseProvisioning ProxyPhase = "Provisioning"
	// PhaseReady means the instance runs and matches the spec (External:
	// recorded with its first verdict). Health is reported separately by
	// the Healthy condition.
	PhaseReady ProxyPhase = "Ready"
	// PhaseReplacing means the instance is being replaced (the spec changed
	// in a way that forces a new one, or it died or stayed Unhealthy too
	// long): the old one is deleted and its successor created, until the
	// successor runs.
	PhaseReplacing ProxyPhase = "Replacing"
	// PhaseDeleting means the Proxy is being deleted and waits for its instance
	// to be gone.
	PhaseDeleting ProxyPhase = "Deleting"
	// PhaseFailed means the operator cannot make progress without a change to the
	// spec or the providers config; status.message says why.
	PhaseFailed ProxyPhase = "Failed"
)

// ProxySpec is the desired proxy. For Managed proxies, a change to placement,
// cloudInit (or its Secret's content), port or provider replaces the instance:
// same name, new IP.
//
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || has(self.provider)",message="spec.provider is required when spec.mode is Managed: name a provider instance from the operator's providers config"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.provider)",message="spec.provider is forbidden when spec.mode is External: External proxies are not provisioned"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || has(self.external)",message="spec.external is required when spec.mode is External: set spec.external.address"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || !has(self.external)",message="spec.external is forbidden when spec.mode is Managed: the provider assigns the address"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.placement)",message="spec.placement is forbidden when spec.mode is External: only Managed proxies are placed"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.cloudInit)",message="spec.cloudInit is forbidden when spec.mode is External: only Managed proxies are provisioned"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || !has(self.attributes) || !self.attributes.exists(k, k in ['zone', 'region', 'cloud'])",message="spec.attributes must not set zone, region or cloud on a Managed proxy: the operator derives them from its placement and provider (an External proxy may declare them)"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.credentials)",message="spec.credentials is forbidden when spec.mode is External: declare an External proxy's credentials in spec.external.credentials"
type ProxySpec struct {
	// mode is Managed (the operator provisions the proxy through spec.provider)
	// or External (the proxy runs elsewhere at spec.external; the operator only
	// tracks and health-checks it). Immutable once set.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.mode is immutable: delete the Proxy and create a new one to change it"
	Mode ProxyMode `json:"mode"`

	// provider is the name of a provider instance in the operator's providers
	// config (for example gcp-eu or kind-local). Required when mode is Managed,
	// forbidden when mode is External.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Provider string `json:"provider,omitempty"`

	// port is the TCP port the proxy listens on, 1-65535. Managed proxies are
	// configured to listen on it; External proxies are reached on it unless
	// spec.external.port is set.
	// +optional
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// attributes are free-form labels that crawler clients select proxies by
	// through the discovery API, for example geo: eu or tier: residential.
	// The keys healthy, provider, mode and pool are reserved: the operator
	// derives them (pool is the name of the ProxyPool a member belongs to).
	// So are zone, region and cloud for a Managed proxy, which the operator
	// derives from its placement and provider; an External proxy may
	// declare them, so one selector spans Managed and External proxies of
	// a region.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 63 && k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="spec.attributes keys must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 253)",message="spec.attributes values must be at most 253 characters"
	// +kubebuilder:validation:XValidation:rule="!self.exists(k, k in ['healthy', 'provider', 'mode', 'pool'])",message="spec.attributes must not set the reserved keys healthy, provider, mode or pool: the operator derives them"
	Attributes map[string]string `json:"attributes,omitempty"`

	// placement says where a Managed proxy runs. Which fields are required
	// depends on the provider (gcp needs zone, machineType and image unless
	// its config supplies defaults). Forbidden when mode is External.
	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// cloudInit is the user-data a Managed proxy's instance boots with,
	// either inline or from a Secret. Rotating the Secret's content replaces
	// the instance. Forbidden when mode is External.
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// credentials names the Secret whose username and password this Managed
	// proxy requires of every client, instead of the credentials the
	// operator generates for its provider instance. Authentication is
	// always required, in addition to the provider's source ranges; a new
	// password in the Secret replaces the instance. Forbidden when mode is
	// External (see spec.external.credentials).
	// +optional
	Credentials *CredentialsSource `json:"credentials,omitempty"`

	// external is where an External proxy is reached. Required when mode is
	// External, forbidden when mode is Managed.
	// +optional
	External *ExternalEndpoint `json:"external,omitempty"`

	// healthCheck overrides the operator's probe defaults for this proxy.
	// +optional
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`

	// banRecycling replaces a Managed proxy that the sites it crawls block:
	// blocked by at least `hosts` distinct hosts within `window` (reports,
	// canaries, the gateway's refusals), it gets a new instance and a new
	// IP, and its old exit IP is never served again for a while. Unset:
	// the ProxyPool's spec.banRecycling for a pool member (on by default),
	// off for a single Proxy. Ignored for External proxies.
	// +optional
	BanRecycling *BanRecycling `json:"banRecycling,omitempty"`
}

// Ban recycling's defaults: on for pool members, off for single Proxies.
const (
	DefaultBanHosts  = 3
	DefaultBanWindow = 10 * time.Minute
)

// BanRecycling says when a Managed proxy is replaced for bans.
type BanRecycling struct {
	// hosts is how many distinct hosts must have blocked the proxy within
	// window, 0 to 64 (default 3); 0 turns ban recycling off.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	Hosts *int32 `json:"hosts,omitempty"`

	// window is how far back blocks count, between 1m and 1h (default 10m;
	// the outcome memory keeps an hour).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('1h')",message="banRecycling.window must be a duration between 1m and 1h"
	Window *metav1.Duration `json:"window,omitempty"`
}

// Resolved is b's hosts and window with the defaults filled in; nil
// resolves to the defaults.
func (b *BanRecycling) Resolved() (hosts int, window time.Duration) {
	hosts, window = DefaultBanHosts, DefaultBanWindow
	if b == nil {
		return hosts, window
	}
	if b.Hosts != nil {
		hosts = int(*b.Hosts)
	}
	if b.Window != nil {
		window = b.Window.Duration
	}
	return hosts, window
}

// Placement says where a provider should run a Managed proxy.
type Placement struct {
	// zone, for example europe-west1-b.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Zone string `json:"zone,omitempty"`

	// region, for example europe-west1. Informational for zonal providers;
	// discovery exposes it as the derived attribute region.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Region string `json:"region,omitempty"`

	// machineType, for example e2-small.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	MachineType string `json:"machineType,omitempty"`

	// image is the boot image (gcp: for example
	// projects/debian-cloud/global/images/family/debian-12).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// parameters are provider-specific settings that have no field of their
	// own; each provider documents the keys it reads and rejects unknown ones.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 63)",message="spec.placement.parameters keys must be at most 63 characters"
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(self[k]) <= 256)",message="spec.placement.parameters values must be at most 256 characters"
	Parameters map[string]string `json:"parameters,omitempty"`
}

// CloudInit is the user-data for a Managed proxy's instance: exactly one of
// inline or secretRef.
// +kubebuilder:validation:XValidation:rule="has(self.inline) != has(self.secretRef)",message="spec.cloudInit must set exactly one of inline or secretRef"
type CloudInit struct {
	// inline is the cloud-init document itself.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=262144
	Inline string `json:"inline,omitempty"`

	// secretRef names a key of a Secret in the Proxy's namespace that holds
	// the cloud-init document. The Secret must carry the label
	// crawl.example.com/cloud-init: "true", or the operator cannot see it.
	// +optional
	SecretRef *SecretKeyReference `json:"secretRef,omitempty"`
}

// SecretKeyReference points at one key of a Secret in the Proxy's namespace.
type SecretKeyReference struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key within the Secret's data.
	// +optional
	// +kubebuilder:default=user-data
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// ExternalEndpoint is the address of a proxy the operator does not run.
type ExternalEndpoint struct {
	// address is the proxy's hostname or IP address.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="spec.external.address must be a lowercase DNS hostname or an IP address"
	Address string `json:"address"`

	// port the proxy listens on, 1-65535; defaults to spec.port.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// credentials the proxy requires, if any: probes authenticate with
	// them, and discovery hands them to authenticated clients.
	// +optional
	Credentials *CredentialsSource `json:"credentials,omitempty"`

	// openProxyCheck also probes the proxy without credentials, as every
	// Managed proxy is: one that tunnels an unauthenticated CONNECT is
	// Unhealthy with reason OpenProxy and never leased. Off by default, as
	// an External proxy may be open by design (on a private network).
	// +optional
	OpenProxyCheck bool `json:"openProxyCheck,omitempty"`
}

// CredentialsSource says where a proxy's credentials are kept.
type CredentialsSource struct {
	// secretRef names a Secret in the Proxy's namespace holding the keys
	// username and password (the kubernetes.io/basic-auth layout; the
	// password 16-72 printable characters). The Secret must carry the label
	// crawl.example.com/proxy-credentials: "true", or the operator cannot
	// see it.
	// +required
	SecretRef LocalSecretReference `json:"secretRef"`
}

// LocalSecretReference names a Secret in the Proxy's namespace.
type LocalSecretReference struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// HealthCheck overrides how the operator probes one proxy. Unset fields take
// the operator's defaults (flags).
// +kubebuilder:validation:XValidation:rule="!has(self.timeout) || !has(self.interval) || duration(self.timeout) <= duration(self.interval)",message="spec.healthCheck.timeout must not exceed spec.healthCheck.interval"
type HealthCheck struct {
	// url is fetched through the proxy (CONNECT, then TLS to the target) to
	// prove the proxy can egress. Must be an https URL.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHost() != ''",message="spec.healthCheck.url must be an absolute https URL"
	URL string `json:"url,omitempty"`

	// interval between probes, between 1s and 1h (for example 30s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="spec.healthCheck.interval must be a duration between 1s and 1h"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// timeout of one probe, between 100ms and 5m, and not above interval.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms') && duration(self) <= duration('5m')",message="spec.healthCheck.timeout must be a duration between 100ms and 5m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// failureThreshold is how many consecutive failed probes make a healthy
	// proxy Unhealthy, 1-100.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	FailureThreshold *int32 `json:"failureThreshold,omitempty"`

	// successThreshold is how many consecutive successful probes make an
	// unhealthy proxy Healthy, 1-100.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	SuccessThreshold *int32 `json:"successThreshold,omitempty"`

	// replaceAfter is how long a Managed proxy may stay Unhealthy without a
	// break before the operator replaces its instance (same name, new IP),
	// between 0 and 24h; 0 never replaces it for failing probes. Default: the
	// operator's --unhealthy-replace-after flag. Ignored for External proxies.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="spec.healthCheck.replaceAfter must be a duration between 0s and 24h"
	ReplaceAfter *metav1.Duration `json:"replaceAfter,omitempty"`

	// targets are canaries on the team's own sites, probed through the
	// proxy now and then (--canary-interval, within each host's share of
	// the probes): a failing canary keeps the proxy away from that host
	// only (a cooldown, and a blocked outcome), and never makes it
	// Unhealthy. At most 8.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Targets []CanaryTarget `json:"targets,omitempty"`
}

// CanaryTarget is one of the team's own sites, probed through the proxy to
// learn whether that site lets it in.
type CanaryTarget struct {
	// name identifies the canary in status and metrics (a DNS label).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// url is fetched through the proxy: an absolute http or https URL.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHost() != ''",message="a canary's url must be an absolute http or https URL"
	URL string `json:"url"`

	// allowedStatuses are the HTTP statuses that mean the site let the
	// proxy in (default [200]).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=100
	// +kubebuilder:validation:items:Maximum=599
	AllowedStatuses []int32 `json:"allowedStatuses,omitempty"`

	// blockedMarker, when set, is text whose presence in the first 64 KiB
	// of the body means blocked even under an allowed status (a ban page
	// served with 200).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	BlockedMarker string `json:"blockedMarker,omitempty"`
}

// Canary verdicts in status.canaries.
const (
	CanaryAllowed = "Allowed"
	CanaryBlocked = "Blocked"
	// CanaryUnknown: the fetch failed for another reason (a timeout, a
	// reset): it says nothing of the site's view of the proxy.
	CanaryUnknown = "Unknown"
)

// Proxy is one HTTP egress proxy that crawlers lease through the discovery
// API: provisioned by the operator (Managed) or merely tracked (External).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is written as a label value on the proxy's instance"
// +kubebuilder:resource:scope=Namespaced,shortName=px,categories=crawl
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Country",type=string,JSONPath=`.status.geo.country`,priority=1
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.status.geo.asn`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired proxy.
	// +required
	Spec ProxySpec `json:"spec"`

	// status is what the operator observed.
	// +optional
	Status ProxyStatus `json:"status,omitempty"`
}

// ProxyList is a list of Proxies.
//
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}
