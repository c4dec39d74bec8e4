package gcp

import (
	"testing"

	"github.com/stretchr/testify/assert"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func TestLabelsSurviveTheRoundTripThroughGCE(t *testing.T) {
	labels := map[string]string{
		crawlv1alpha1.LabelClusterID:      "prod_eu-1",
		crawlv1alpha1.LabelOperatorID:     "tenant-a_egress-proxies-operator",
		crawlv1alpha1.LabelOwnerNamespace: "crawl",
		crawlv1alpha1.LabelOwnerName:      "eu.proxy-1",
		crawlv1alpha1.LabelProvider:       "gcp-eu",
	}
	gce := toGCELabels(labels)
	assert.Equal(t, "eu_proxy-1", gce["crawl-owner-name"], "'.' is not a GCE label character")
	assert.Equal(t, "tenant-a_egress-proxies-operator", gce["crawl-operator-id"], "owner ids are written as they are")
	for _, v := range gce {
		assert.Regexp(t, `^[-_a-z0-9]*$`, v)
	}
	assert.Equal(t, labels, fromGCELabels(gce), "read back, they are the operator's labels again: '_' in an owner id stays '_'")
}
