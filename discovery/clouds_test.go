package discovery

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// A Managed proxy carries its provider's cloud; an External one declares
// its own zone and region, so one selector spans both.
func TestCloudsAndRegionsSpanManagedAndExternal(t *testing.T) {
	f := newFixture(t)
	f.view.SetClouds(map[string]string{"aws-eu": "aws", "gcp-eu": "gcp"})
	add := func(p *crawlv1alpha1.Proxy) {
		p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0." + p.Name[len(p.Name)-1:], Port: 3128}
		testenv.SetHealth(p, metav1.ConditionTrue, "x")
		f.view.Upsert(p)
	}
	add(&crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "aws-1"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "aws-eu", Port: 3128,
			Placement: &crawlv1alpha1.Placement{Zone: "eu-west-1a", Region: "eu-west-1"}}})
	add(&crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "gcp-2"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128,
			Placement: &crawlv1alpha1.Placement{Zone: "europe-west1-b", Region: "europe-west1"}}})
	add(&crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "ext-3"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, External: &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.3"},
			Attributes: map[string]string{"region": "eu-west-1", "zone": "eu-west-1c"}}})

	ids := func(query string) []string {
		t.Helper()
		r := f.do("GET", "/v1/proxies?"+query, "")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		var out []string
		for _, p := range r.body["proxies"].([]any) {
			out = append(out, p.(map[string]any)["id"].(string))
		}
		return out
	}
	assert.ElementsMatch(t, []string{"crawl/aws-1", "crawl/ext-3"}, ids("region=eu-west-1"), "a region's Managed and External proxies")
	assert.Equal(t, []string{"crawl/aws-1"}, ids("cloud=aws"))
	assert.Equal(t, []string{"crawl/gcp-2"}, ids("cloud=gcp"))
	assert.Equal(t, []string{"crawl/ext-3"}, ids("zone=eu-west-1c"))
}
