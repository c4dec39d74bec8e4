package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/client"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// exampleAPI is a discovery API serving one healthy proxy, eu-1, for the
// examples; a crawler would use the operator's Service instead.
func exampleAPI() (url string, stop func()) {
	view := broker.NewView(nil, "operator-ns")
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "eu"},
			External: &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.71"}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.71", Port: 3128},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "ProbeSucceeded")
	view.Handler().OnAdd(p, false)
	srv := httptest.NewServer(discovery.NewServer(discovery.Options{
		Store: lease.NewMemoryStore(nil), View: view, Tokens: discovery.StaticToken("s3cret"),
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: 15 * time.Minute,
	}).Handler())
	return srv.URL, srv.Close
}

// Lease a proxy for a site, tell the API the site rate-limited it, and
// release it.
func ExampleClient_Lease() {
	api, stop := exampleAPI()
	defer stop()
	ctx := context.Background()
	c, err := client.New(api, "s3cret")
	if err != nil {
		panic(err)
	}
	lease, err := c.Lease(ctx, client.LeaseRequest{Selector: map[string]string{"geo": "eu"}, Target: "shop.example", TTL: 5 * time.Minute})
	if err != nil {
		panic(err)
	}
	proxy, _ := lease.ProxyURL()
	fmt.Println("crawl shop.example through", lease.Proxy.ID, "at", proxy.Host)

	// The site answered 429 with Retry-After: 600.
	err = c.Report(ctx, lease.ID, client.Report{Result: client.ResultRateLimited, Target: "shop.example", RetryAfter: 10 * time.Minute})
	if err != nil {
		panic(err)
	}
	_, err = c.Lease(ctx, client.LeaseRequest{Selector: map[string]string{"geo": "eu"}, Target: "shop.example"})
	fmt.Println("another lease for shop.example:", client.HasCode(err, client.CodeNoProxyAvailable))
	fmt.Println(c.Release(ctx, lease.ID))
	// Output:
	// crawl shop.example through crawl/eu-1 at 127.0.0.71:3128
	// another lease for shop.example: true
	// <nil>
}

// A crawler's http.Client whose requests each go through a leased proxy for
// their host, with 429s and 403s reported: the Transport does it all.
func ExampleTransport() {
	api, stop := exampleAPI()
	defer stop()
	c, err := client.New(api, "s3cret")
	if err != nil {
		panic(err)
	}
	tr := &client.Transport{Client: c, Selector: map[string]string{"geo": "eu"}, TTL: 5 * time.Minute}
	defer tr.Close()
	crawler := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	_ = crawler // crawler.Get("https://shop.example/") goes through crawl/eu-1

	// Colly, or an http.Transport of your own, takes the proxy function:
	//   collector.SetProxyFunc(tr.Proxy)
	//   &http.Transport{Proxy: tr.Proxy}
	req, _ := http.NewRequest(http.MethodGet, "https://shop.example/", nil)
	proxy, err := tr.Proxy(req)
	fmt.Println(proxy.Host, err, tr.Current("shop.example"))
	// Output: 127.0.0.71:3128 <nil> crawl/eu-1
}
