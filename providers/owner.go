package providers

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// Owner is who made an instance: the cluster, and the operator in it. Two
// operators in one cluster (one per tenant, say), even with provider
// instances of the same name in the same cloud project, list, watch and
// collect only what carries their own Owner.
type Owner struct {
	// ClusterID tells clusters apart (by default the kube-system
	// namespace's UID).
	ClusterID string
	// OperatorID tells the operators of one cluster apart (by default the
	// release's namespace and name, see OperatorID).
	OperatorID string
}

// Labels are the owner labels every instance and record carries.
func (o Owner) Labels() map[string]string {
	return map[string]string{crawlv1alpha1.LabelClusterID: o.ClusterID, crawlv1alpha1.LabelOperatorID: o.OperatorID}
}

// Owns tells whether labels name this owner. An instance made before
// operator ids existed carries none and is owned by no one: GC and the
// instance watcher never act on what they cannot prove is theirs.
func (o Owner) Owns(labels map[string]string) bool {
	return labels[crawlv1alpha1.LabelClusterID] == o.ClusterID && labels[crawlv1alpha1.LabelOperatorID] == o.OperatorID
}

// String is the owner in logs and in what the gcp provider writes where
// GCE has no labels (firewall descriptions).
func (o Owner) String() string { return o.ClusterID + "/" + o.OperatorID }

// LabelValuePattern is what an owner part must match: a label value both in
// Kubernetes and in GCE (lowercase letters, digits, '-' and '_', at most 63).
var LabelValuePattern = regexp.MustCompile(`^[a-z0-9]([-_a-z0-9]{0,61}[a-z0-9])?$`)

// OperatorID is the default operator id for the release called name in
// namespace: "<namespace>_<name>" ('_' appears in neither, so no two
// releases share one), shortened with a hash suffix past 63 characters.
func OperatorID(namespace, name string) string {
	id := sanitize(namespace) + "_" + sanitize(name)
	if len(id) <= maxLabelValue {
		return id
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(id[:maxLabelValue-len(suffix)], "-_") + suffix
}

// maxLabelValue is the longest label value Kubernetes and GCE accept.
const maxLabelValue = 63
