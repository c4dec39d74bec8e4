package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TenantQuotaSpec bounds one crawler team's share of the fleet. The team
// is the ServiceAccount of the TenantQuota's namespace and name (its
// crawlers' tokens name it); every replica of the operator holds it to the
// same limits. An unset limit is no limit.
type TenantQuotaSpec struct {
	// maxLeases bounds the team's live leases from the discovery API,
	// 0-100000.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MaxLeases *int32 `json:"maxLeases,omitempty"`

	// maxTunnels bounds the team's open gateway tunnels (and plain-HTTP
	// requests in flight), 0-100000.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MaxTunnels *int32 `json:"maxTunnels,omitempty"`

	// tunnelsPerSecond bounds how fast the team opens gateway tunnels, on
	// average, 1-100000; bursts of up to one second's worth pass.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	TunnelsPerSecond *int32 `json:"tunnelsPerSecond,omitempty"`

	// gatewayBytesPerDay bounds the bytes the team's tunnels carry, both
	// ways, per UTC day (10Gi). A tunnel open when the day's bytes run out
	// is not cut; new ones are refused until midnight UTC.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(self).isGreaterThan(quantity('0'))",message="spec.gatewayBytesPerDay must be positive"
	GatewayBytesPerDay *resource.Quantity `json:"gatewayBytesPerDay,omitempty"`
}

// TenantQuota bounds the share of the fleet of the crawler team whose
// ServiceAccount has its namespace and name.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=tq,categories=crawl
// +kubebuilder:printcolumn:name="Leases",type=integer,JSONPath=`.spec.maxLeases`
// +kubebuilder:printcolumn:name="Tunnels",type=integer,JSONPath=`.spec.maxTunnels`
// +kubebuilder:printcolumn:name="Tunnels/s",type=integer,JSONPath=`.spec.tunnelsPerSecond`
// +kubebuilder:printcolumn:name="Bytes/day",type=string,JSONPath=`.spec.gatewayBytesPerDay`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec TenantQuotaSpec `json:"spec"`
}

// TenantQuotaList is a list of TenantQuotas.
//
// +kubebuilder:object:root=true
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}

// ServiceAccountUser is the user name of the ServiceAccount a TenantQuota
// bounds: the tenant its crawlers' tokens name.
func (q *TenantQuota) ServiceAccountUser() string {
	return "system:serviceaccount:" + q.Namespace + ":" + q.Name
}
