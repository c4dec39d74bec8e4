package geo

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/geoip"
)

// TestJudge: what status.geo says for what a Proxy declares and what the
// database answers.
func TestJudge(t *testing.T) {
	brussels := geoip.Location{Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}
	proxy := func(attrs map[string]string, placement *crawlv1alpha1.Placement, ip, egress string) *crawlv1alpha1.Proxy {
		return &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "px"},
			Spec:   crawlv1alpha1.ProxySpec{Attributes: attrs, Placement: placement},
			Status: crawlv1alpha1.ProxyStatus{IP: ip, EgressIP: egress}}
	}
	cases := []struct {
		name     string
		proxy    *crawlv1alpha1.Proxy
		loc      geoip.Location
		found    bool
		want     *crawlv1alpha1.ProxyGeo
		mismatch string
	}{
		{"no address yet: nothing", proxy(nil, nil, "", ""), brussels, true, nil, ""},
		{"the database does not know it: nothing", proxy(nil, nil, "203.0.113.7", ""), geoip.Location{}, false, nil, ""},
		{"nothing declared: the database's word", proxy(nil, nil, "203.0.113.7", ""), brussels, true,
			&crawlv1alpha1.ProxyGeo{IP: "203.0.113.7", Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}, ""},
		{"the egress IP is what sites see", proxy(nil, nil, "10.0.0.7", "203.0.113.9"), brussels, true,
			&crawlv1alpha1.ProxyGeo{IP: "203.0.113.9", Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}, ""},
		{"a declared country that agrees, in any case", proxy(map[string]string{"country": "be", "asn": "AS396982"}, nil, "203.0.113.7", ""), brussels, true, nil, ""},
		{"a declared country the database contradicts", proxy(map[string]string{"country": "de"}, nil, "203.0.113.7", ""), brussels, true, nil,
			"country de is declared; the database places the exit IP in BE"},
		{"a declared asn the database contradicts", proxy(map[string]string{"asn": "16509"}, nil, "203.0.113.7", ""), brussels, true, nil,
			"asn 16509 is declared; the database says AS396982 (GOOGLE-CLOUD-PLATFORM)"},
		{"a zone in another country", proxy(nil, &crawlv1alpha1.Placement{Zone: "europe-west4-a"}, "203.0.113.7", ""), brussels, true, nil,
			"region europe-west4-a is in NL; the database places the exit IP in BE"},
		{"a region in the same country", proxy(nil, &crawlv1alpha1.Placement{Region: "europe-west1"}, "203.0.113.7", ""), brussels, true, nil, ""},
		{"an External proxy's region attribute", proxy(map[string]string{"region": "eu-west-1"}, nil, "203.0.113.7", ""), brussels, true, nil,
			"region eu-west-1 is in IE; the database places the exit IP in BE"},
		{"a region nobody knows contradicts nothing", proxy(map[string]string{"region": "basement"}, nil, "203.0.113.7", ""), brussels, true, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Judge(c.proxy, c.loc, c.found)
			if c.want != nil {
				assert.Equal(t, c.want, got)
				return
			}
			if c.found && c.proxy.ExitIP() != "" {
				if assert.NotNil(t, got) {
					assert.Equal(t, c.mismatch, got.Mismatch)
				}
				return
			}
			assert.Nil(t, got)
		})
	}
}
