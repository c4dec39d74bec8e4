package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProxyPoolSpec is a desired fleet of Managed proxies, shaped like a
// Deployment: a replica count, a template, and a rolling strategy that
// every replacement (a template change, age recycling, a member Unhealthy
// for too long) goes through.
//
// +kubebuilder:validation:XValidation:rule="((!has(self.zones) || size(self.zones) == 0) && (!has(self.providers) || size(self.providers) == 0)) || !has(self.template.spec.placement) || !has(self.template.spec.placement.zone)",message="spec.template.spec.placement.zone is forbidden when spec.zones or spec.providers is set: the pool gives each member its zone"
// +kubebuilder:validation:XValidation:rule="!has(self.providers) || size(self.providers) == 0 || !has(self.zones) || size(self.zones) == 0",message="spec.zones is forbidden when spec.providers is set: list each provider's zones in its entry"
// +kubebuilder:validation:XValidation:rule="!has(self.providers) || size(self.providers) == 0 || (has(self.template.spec.provider) && self.providers.exists(p, p.name == self.template.spec.provider))",message="spec.template.spec.provider must be one of spec.providers"
// +kubebuilder:validation:XValidation:rule="!has(self.providers) || size(self.providers) == 0 || self.providers.exists(p, !has(p.weight) || p.weight > 0)",message="spec.providers needs a provider of weight above 0"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || self.autoscaling.minReplicas <= self.autoscaling.maxReplicas",message="spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas"
type ProxyPoolSpec struct {
	// replicas is how many members the pool keeps, 0-1000. With
	// spec.autoscaling set, the autoscaler writes it (as an HPA would,
	// through the scale subresource); kubectl scale then only lasts until
	// its next decision.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Replicas *int32 `json:"replicas,omitempty"`

	// template is what every member is made from. A change to it rolls the
	// pool: each member is replaced by one made from the new template.
	// +required
	Template ProxyTemplate `json:"template"`

	// zones the members are spread over evenly (at most one apart); each
	// member gets its zone in spec.placement.zone. For the kubernetes
	// provider the zone becomes a node constraint on
	// topology.kubernetes.io/zone. Empty: members are not placed in zones.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	Zones []string `json:"zones,omitempty"`

	// providers spread the members over several provider instances by
	// weight (another cloud is another network: sites block whole clouds
	// by ASN), and within each over its zones, as spec.zones does within
	// one. Each member gets its provider in spec.provider and its zone in
	// spec.placement.zone; the template's machine type and image, when
	// set, apply to every provider, so leave them to each provider
	// instance's defaults in a pool across clouds. Changing it moves
	// members as changing spec.zones does. Empty: every member uses the
	// template's provider.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Providers []PoolProvider `json:"providers,omitempty"`

	// maxAge is how old a member may grow before the pool replaces it (a
	// rolling replacement, so the fleet's IPs rotate without anyone
	// acting), at least 30s. Unset: members are never recycled for age.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('30s')",message="spec.maxAge must be a duration of at least 30s"
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// maxAgeJitterPercent shortens each member's maxAge by up to this
	// share, fixed per member, so members created together are not all
	// recycled at once, 0-50.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=50
	MaxAgeJitterPercent int32 `json:"maxAgeJitterPercent,omitempty"`

	// minReadySeconds is how long a member must be Ready (provisioned and
	// healthy) before it counts as available, 0-3600.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`

	// strategy bounds how replacements roll.
	// +optional
	Strategy PoolStrategy `json:"strategy,omitempty"`

	// banRecycling replaces members that the sites they crawl block
	// (Proxy spec.banRecycling): on by default for a pool, with 3 hosts in
	// 10m; hosts 0 turns it off. A member's own spec.banRecycling (from the
	// template) wins. Changing it here replaces no member.
	// +optional
	BanRecycling *BanRecycling `json:"banRecycling,omitempty"`

	// placementFallback says what the pool may change in a member's
	// placement when its provider has no room for it.
	// +optional
	PlacementFallback *PlacementFallback `json:"placementFallback,omitempty"`

	// autoscaling, when set, sizes the pool from the discovery API's demand:
	// the leases its members hold and the lease requests refused for want
	// of one of them.
	// +optional
	Autoscaling *PoolAutoscaling `json:"autoscaling,omitempty"`
}

// PoolProvider is one provider instance of a pool across providers.
type PoolProvider struct {
	// name of a provider instance in the operator's providers config.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// weight is this provider's share of the members, relative to the
	// others' (0-100; 0 drains it). Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Weight *int32 `json:"weight,omitempty"`

	// zones this provider's members are spread over evenly. Empty: its
	// members are not placed in zones (the provider's default applies).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	Zones []string `json:"zones,omitempty"`
}

// PlacementFallback is what a pool may change in a member's placement
// when its provider has no room for it. Whatever it says, a zone (or a
// provider) with no room gets no new member for a while and the others
// take its share.
type PlacementFallback struct {
	// standardForSpot: a Spot member refused for capacity is replaced in
	// its zone by a standard one (its Spot parameter dropped: gcp
	// provisioningModel SPOT, aws marketType spot) for as long as the
	// zone is full, instead of going to another zone. Standard members
	// stay so until they are replaced for another cause.
	// +optional
	StandardForSpot bool `json:"standardForSpot,omitempty"`
}

// ProxyTemplate is what a pool's members are made from.
type ProxyTemplate struct {
	// metadata: the labels and annotations every member carries.
	// +optional
	Metadata TemplateMetadata `json:"metadata,omitempty"`

	// spec of every member: a Managed Proxy spec. spec.placement.zone is set
	// per member when spec.zones is, and the attribute pool is derived.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.mode == 'Managed'",message="spec.template.spec.mode must be Managed: a pool provisions its members"
	Spec ProxySpec `json:"spec"`
}

// TemplateMetadata is the part of a member's metadata the template sets.
type TemplateMetadata struct {
	// labels of every member.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// annotations of every member.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PoolStrategy is a rolling replacement's budget, as a Deployment's
// RollingUpdate: surge first, retire an old member only once the pool
// stays at or above replicas - maxUnavailable available members.
// +kubebuilder:validation:XValidation:rule="!has(self.maxSurge) || (self.maxSurge != 0 && self.maxSurge != '0%') || (has(self.maxUnavailable) && self.maxUnavailable != 0 && self.maxUnavailable != '0%')",message="spec.strategy.maxSurge is 0, so spec.strategy.maxUnavailable must be above 0 (its default is 0): the pool could never replace a member"
type PoolStrategy struct {
	// maxSurge is how many members above replicas may exist during a
	// replacement: a number or a percentage of replicas (rounded up).
	// Default 1.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="spec.strategy.maxSurge must be a non-negative number or a percentage such as 25%"
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// maxUnavailable is how many members below replicas may be unavailable
	// during a replacement: a number or a percentage of replicas (rounded
	// down). Default 0.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",message="spec.strategy.maxUnavailable must be a non-negative number or a percentage such as 25%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// PoolAutoscaling sizes a pool from demand.
type PoolAutoscaling struct {
	// minReplicas is the fewest members the autoscaler keeps, 0-1000.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinReplicas int32 `json:"minReplicas"`

	// maxReplicas is the most members the autoscaler asks for, 1-1000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxReplicas int32 `json:"maxReplicas"`

	// targetLeasesPerMember is how many active leases each member should
	// carry: the pool grows when they carry more, or when lease requests
	// for the pool are refused for want of a member, 1-10000.
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	TargetLeasesPerMember int32 `json:"targetLeasesPerMember,omitempty"`

	// scaleDownDelay is how long demand must stay low before the pool
	// shrinks, 0-24h (default 5m): a scale-down follows the highest
	// recommendation of that window.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('24h')",message="spec.autoscaling.scaleDownDelay must be a duration between 0s and 24h"
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`
}

// ProxyPoolStatus is what the pool controller observed of its members.
type ProxyPoolStatus struct {
	// replicas is how many members exist (not being deleted).
	// +optional
	Replicas int32 `json:"replicas"`

	// readyReplicas are members that are Ready: provisioned and healthy.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// availableReplicas are members Ready for at least minReadySeconds:
	// what the disruption budget counts.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`

	// updatedReplicas are members made from the current template.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// recycling is how many members are being replaced now (outdated, too
	// old, Unhealthy too long, or in a zone with too many).
	// +optional
	Recycling int32 `json:"recycling"`

	// selector is the label selector of the members, as the scale
	// subresource needs it.
	// +optional
	Selector string `json:"selector,omitempty"`

	// templateHash is the hash of the current template, as every updated
	// member's label carries it.
	// +optional
	TemplateHash string `json:"templateHash,omitempty"`

	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// autoscaling is what the autoscaler last saw and decided.
	// +optional
	Autoscaling *PoolAutoscalingStatus `json:"autoscaling,omitempty"`

	// conditions: Available, Progressing and ScalingLimited.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// PoolAutoscalingStatus is the autoscaler's memory, kept in status so a
// restarted operator scales down no sooner than the one before would have.
type PoolAutoscalingStatus struct {
	// desiredReplicas is the autoscaler's last recommendation.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`
	// activeLeases are the leases the members held at the last decision.
	// +optional
	ActiveLeases int32 `json:"activeLeases"`
	// lastHighDemandTime is when demand last asked for at least the
	// current replicas: the scale-down delay counts from it.
	// +optional
	LastHighDemandTime *metav1.Time `json:"lastHighDemandTime,omitempty"`
	// lastScaleTime is when the autoscaler last changed spec.replicas.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`
}

// ProxyPool is a declarative fleet of Managed Proxies: spread over zones,
// recycled by age, healed and scaled, with every replacement rolled under
// one disruption budget.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="metadata.name must be at most 52 characters: members are named from it"
// +kubebuilder:resource:scope=Namespaced,shortName=pxp,categories=crawl
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.template.spec.provider`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.availableReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired fleet.
	// +required
	Spec ProxyPoolSpec `json:"spec"`

	// status is what the pool controller observed.
	// +optional
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// ProxyPoolList is a list of ProxyPools.
//
// +kubebuilder:object:root=true
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyPool `json:"items"`
}

// Pool condition types and the labels that tie members to their pool.
const (
	// ConditionAvailable is True when at least replicas - maxUnavailable
	// members are available.
	ConditionAvailable = "Available"
	// ConditionProgressing is True while members are being created or
	// replaced, and stays True with reason PoolSettled once done.
	ConditionProgressing = "Progressing"
	// ConditionScalingLimited is True when the autoscaler wanted more than
	// maxReplicas or fewer than minReplicas.
	ConditionScalingLimited = "ScalingLimited"
	// ConditionPlacementLimited is True while a zone (or a provider) of the
	// pool has no room for a new member (a create refused for capacity or
	// quota): members go to the others until it is tried again.
	ConditionPlacementLimited = "PlacementLimited"

	// LabelPool names the ProxyPool a member belongs to.
	LabelPool = "crawl.example.com/pool"
	// LabelPoolTemplateHash is the hash of the template a member was made
	// from; a member whose hash differs from the pool's is rolled.
	LabelPoolTemplateHash = "crawl.example.com/pool-template-hash"
	// LabelZone is the zone the pool gave a member, for the spread.
	LabelZone = "crawl.example.com/zone"
)
