package gcp

import (
	"strings"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// GCE label keys and values allow only lowercase letters, digits, '-' and
// '_' (keys start with a letter; both at most 63 characters), so the
// operator's labels are written under keys of their own. Values that are
// Kubernetes names may contain '.', which GCE forbids; '_' never appears in a
// Kubernetes name, so mapping '.' to '_' is reversible. The owner ids are
// GCE label values already (and may contain '_'): they are written as they
// are.
var gceLabelKeys = map[string]string{
	crawlv1alpha1.LabelClusterID:      "crawl-cluster-id",
	crawlv1alpha1.LabelOperatorID:     "crawl-operator-id",
	crawlv1alpha1.LabelProvider:       "crawl-provider",
	crawlv1alpha1.LabelOwnerNamespace: "crawl-owner-namespace",
	crawlv1alpha1.LabelOwnerName:      "crawl-owner-name",
	crawlv1alpha1.LabelOwnerUID:       "crawl-owner-uid",
	crawlv1alpha1.LabelSpecHash:       "crawl-spec-hash",
}

// portLabel records the proxy port on the VM: GCE has no field for it.
const portLabel = "crawl-port"

// sessionAddressesLabel records how many addresses of its IPv6 range the
// VM's Squid leaves from (settings.ipv6 when it was made).
const sessionAddressesLabel = "crawl-session-addresses"

// verbatim are the labels whose values need no mapping: the owner ids.
var verbatim = map[string]bool{crawlv1alpha1.LabelClusterID: true, crawlv1alpha1.LabelOperatorID: true}

// toGCELabels translates the operator's labels to GCE labels.
func toGCELabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		if gk, ok := gceLabelKeys[k]; ok {
			out[gk] = gceValue(k, v)
		}
	}
	return out
}

func gceValue(key, value string) string {
	if verbatim[key] {
		return value
	}
	return strings.ReplaceAll(value, ".", "_")
}

// fromGCELabels translates GCE labels back to the operator's labels, so the
// reconciler and GC read the same keys from every provider.
func fromGCELabels(labels map[string]string) map[string]string {
	out := make(map[string]string, len(gceLabelKeys))
	for k, gk := range gceLabelKeys {
		switch v, ok := labels[gk]; {
		case !ok:
		case verbatim[k]:
			out[k] = v
		default:
			out[k] = strings.ReplaceAll(v, "_", ".")
		}
	}
	return out
}
