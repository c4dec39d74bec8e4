package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CanaryStatus is the last verdict of one canary.
type CanaryStatus struct {
	// name is the canary's (spec.healthCheck.targets[].name).
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// host is the canary URL's host: the one a Blocked verdict keeps the
	// proxy away from.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host,omitempty"`
	// verdict is Allowed, Blocked or Unknown.
	// +required
	// +kubebuilder:validation:Enum=Allowed;Blocked;Unknown
	Verdict string `json:"verdict"`
	// message says what the last fetch got (a status, the marker found).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
	// lastTransitionTime is when the verdict last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
}

// ProxyStatus is what the operator observed and did.
type ProxyStatus struct {
	// phase summarises the lifecycle; see the conditions for detail.
	// +optional
	Phase ProxyPhase `json:"phase,omitempty"`

	// ip clients connect to: the instance's external IP for Managed proxies,
	// spec.external.address (an IP or hostname) for External ones.
	// +optional
	IP string `json:"ip,omitempty"`

	// port clients connect to.
	// +optional
	Port int32 `json:"port,omitempty"`

	// ipv6Prefix is the IPv6 range a Managed proxy's VM leaves from to
	// sites that have an IPv6 address (GCP's /96, AWS's delegated /80,
	// with the provider's ipv6 settings); empty: IPv4 only. Sites count
	// its whole /64 as one sender (--ipv6-identity-prefix), as the fleet
	// does.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	IPv6Prefix string `json:"ipv6Prefix,omitempty"`

	// sessionAddresses is how many addresses of ipv6Prefix Squid leaves
	// from, one chosen per gateway session (SessionAddress); 0: the VM's
	// own address for every request.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	SessionAddresses int32 `json:"sessionAddresses,omitempty"`

	// instanceName is the provider's name for the instance; deterministic
	// from the Proxy, so it survives replacement.
	// +optional
	InstanceName string `json:"instanceName,omitempty"`

	// provider is the provider instance holding instanceName. It differs
	// from spec.provider only while a proxy moves between providers, until
	// the old instance is deleted.
	// +optional
	Provider string `json:"provider,omitempty"`

	// specHash is the hash of the spec fields whose change forces a
	// replacement, as of the instance now recorded.
	// +optional
	SpecHash string `json:"specHash,omitempty"`

	// lastHealthCheckTime is the time of the last probe that changed the
	// health verdict (status is written on transitions only). Probe recency
	// is in the proxy_operator_healthcheck_last_timestamp_seconds metric.
	// +optional
	LastHealthCheckTime *metav1.Time `json:"lastHealthCheckTime,omitempty"`

	// healthCheckedInstance names the instance the Healthy condition is
	// about (<instanceName>/<specHash>@<ip>:<port>, or <ip>:<port> for an
	// External proxy). A verdict about
	// another instance (a replaced one, an old address) is no verdict: the
	// proxy is not Ready until the health engine has judged this one.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	HealthCheckedInstance string `json:"healthCheckedInstance,omitempty"`

	// egressIP is the address the probe target saw the proxy's requests
	// come from, when it differs from ip (NAT, a provider's gateway in
	// front of an External proxy). Written by the health engine.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	EgressIP string `json:"egressIP,omitempty"`

	// geo is where the geo database places the exit IP (egressIP, else ip),
	// when the operator runs with one (--geoip-database). Written by the
	// geo controller.
	// +optional
	Geo *ProxyGeo `json:"geo,omitempty"`

	// canaries are the last verdicts of spec.healthCheck.targets, one per
	// canary. Written by the health engine.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Canaries []CanaryStatus `json:"canaries,omitempty"`

	// burnedIPRerolls counts the instances in a row that came up on an
	// exit IP retired for bans and were replaced before serving; it goes
	// back to 0 once one serves. Written by the Proxy reconciler.
	// +optional
	BurnedIPRerolls int32 `json:"burnedIPRerolls,omitempty"`

	// bannedInstance is the instance (named as healthCheckedInstance is)
	// the Banned condition is about: a ban of an earlier instance is no
	// ban. Written by the ban judge.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	BannedInstance string `json:"bannedInstance,omitempty"`

	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Provisioned, Healthy and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// message is a short human-readable account of the current phase.
	// +optional
	Message string `json:"message,omitempty"`
}

// ProxyGeo is where the geo database places a proxy's exit IP: what the
// sites it crawls see, whatever its placement says.
type ProxyGeo struct {
	// ip is the exit IP looked up.
	// +kubebuilder:validation:MaxLength=64
	IP string `json:"ip"`
	// country is the ISO 3166-1 alpha-2 code, as the database gives it
	// (the discovery attribute country is the same in lower case).
	// +optional
	// +kubebuilder:validation:MaxLength=8
	Country string `json:"country,omitempty"`
	// city is the city's English name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	City string `json:"city,omitempty"`
	// asn is the autonomous system the address is announced from, and
	// asnOrg the organization holding it.
	// +optional
	ASN int64 `json:"asn,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ASNOrg string `json:"asnOrg,omitempty"`
	// mismatch says which of the proxy's declared attributes (country,
	// asn) or its cloud region's country the database contradicts; empty
	// when none does. A Warning Event GeoMismatch says so too.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Mismatch string `json:"mismatch,omitempty"`
}
