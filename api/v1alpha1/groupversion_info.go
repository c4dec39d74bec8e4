// Package v1alpha1 is the Proxy API: the spec users write, the status the
// operator reports, and the well-known names (labels, finalizer, condition
// types) that the controllers, providers and discovery API share. It holds
// types and constants only and must never import the operator's packages.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +groupName=crawl.example.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "crawl.example.com", Version: "v1alpha1"}

	// SchemeGroupVersion is GroupVersion under the name generated code
	// (the apply configurations) expects.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	// apimachinery's builder keeps this package's imports to apimachinery,
	// so clients can import the API without controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a scheme; main and the tests
	// call it so clients can encode and decode Proxies.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &Proxy{}, &ProxyList{}, &ProxyPool{}, &ProxyPoolList{}, &CrawlTarget{}, &CrawlTargetList{}, &TenantQuota{}, &TenantQuotaList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
