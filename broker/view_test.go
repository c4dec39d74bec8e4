package broker

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// TestGeoAttributes: where the geo database places a proxy's exit IP is
// selectable as the attributes country (lower case, as usernames select
// it), city, asn and asnOrg; what the spec declares stays; a geo about
// another address than the exit IP (the proxy moved, the geo controller
// has not caught up) is no geo.
func TestGeoAttributes(t *testing.T) {
	v := NewView(nil, "operator")
	proxy := func(name, ip string, attrs map[string]string, geo *crawlv1alpha1.ProxyGeo) *crawlv1alpha1.Proxy {
		return &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
			Spec:   crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: attrs},
			Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128, Geo: geo}}
	}
	brussels := &crawlv1alpha1.ProxyGeo{IP: "203.0.113.1", Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}
	v.Upsert(proxy("located", "203.0.113.1", nil, brussels))
	v.Upsert(proxy("declared", "203.0.113.1", map[string]string{"country": "de"}, brussels))
	v.Upsert(proxy("moved", "203.0.113.2", nil, brussels))

	info, ok := v.Lookup("crawl/located", 0)
	require.True(t, ok)
	assert.Equal(t, "be", info.Attributes["country"])
	assert.Equal(t, "Brussels", info.Attributes["city"])
	assert.Equal(t, "396982", info.Attributes["asn"])
	assert.Equal(t, "GOOGLE-CLOUD-PLATFORM", info.Attributes["asnOrg"])

	info, _ = v.Lookup("crawl/declared", 0)
	assert.Equal(t, "de", info.Attributes["country"], "the spec's word stands; status.geo.mismatch tells the contradiction")
	assert.Equal(t, "396982", info.Attributes["asn"], "what it does not declare, the database fills")

	info, _ = v.Lookup("crawl/moved", 0)
	assert.NotContains(t, info.Attributes, "country")

	var ids []string
	for _, p := range v.List(Selector{"country": "be"}, nil) {
		ids = append(ids, p.ID)
	}
	assert.Equal(t, []string{"crawl/located"}, ids)
}
