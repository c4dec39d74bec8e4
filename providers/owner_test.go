package providers

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func TestOperatorID(t *testing.T) {
	assert.Equal(t, "crawl-system_egress-proxies-operator", OperatorID("crawl-system", "egress-proxies-operator"))
	assert.NotEqual(t, OperatorID("a-b", "c"), OperatorID("a", "b-c"), "'_' keeps namespace and name apart")

	long := strings.Repeat("n", 63)
	for _, id := range []string{OperatorID(long, "tenant-a"), OperatorID(long, "tenant-b"), OperatorID("x.y", "Z")} {
		assert.Regexp(t, LabelValuePattern, id, "a label value in Kubernetes and in GCE")
	}
	assert.NotEqual(t, OperatorID(long, "tenant-a"), OperatorID(long, "tenant-b"), "shortened ids stay distinct")
}

func TestOwnerOwnsOnlyItsOwnLabels(t *testing.T) {
	me := Owner{ClusterID: "c1", OperatorID: "ns_a"}
	assert.True(t, me.Owns(me.Labels()))
	for name, labels := range map[string]map[string]string{
		"another cluster":  {crawlv1alpha1.LabelClusterID: "c2", crawlv1alpha1.LabelOperatorID: "ns_a"},
		"another operator": {crawlv1alpha1.LabelClusterID: "c1", crawlv1alpha1.LabelOperatorID: "ns_b"},
		"no operator":      {crawlv1alpha1.LabelClusterID: "c1"},
	} {
		assert.False(t, me.Owns(labels), name)
	}
}
