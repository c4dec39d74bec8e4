package v1alpha1_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func crawlTargetFromSpec(t *testing.T, spec string) *unstructured.Unstructured {
	t.Helper()
	return objectFromSpec(t, "CrawlTarget", "ct", spec)
}

// TestCrawlTargetValidation: bad politeness is refused by the API server
// with a message naming the field; good politeness is defaulted.
func TestCrawlTargetValidation(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	for _, tc := range []struct{ name, spec, want string }{
		{"no host", "requestsPerInterval: 1", "spec.host: Required value"},
		{"a host that is not a host", "host: 'shop example/com'\nrequestsPerInterval: 1", "spec.host must be a lower-case host name"},
		{"upper case", "host: Shop.Example.com\nrequestsPerInterval: 1", "spec.host must be a lower-case host name"},
		{"a URL", "host: 'https://shop.example.com'\nrequestsPerInterval: 1", "spec.host must be a lower-case host name"},
		{"a wildcard for everything", "host: '*'\nrequestsPerInterval: 1", "spec.host must be a lower-case host name"},
		{"a wildcard for a top-level domain", "host: '*.com'\nrequestsPerInterval: 1", "spec.host: a wildcard must name a domain of at least two labels"},
		{"a wildcard inside", "host: 'shop.*.com'\nrequestsPerInterval: 1", "spec.host must be a lower-case host name"},
		{"zero rate", "host: shop.example.com\nrequestsPerInterval: 0", "spec.requestsPerInterval in body should be greater than or equal to 1"},
		{"negative rate", "host: shop.example.com\nrequestsPerInterval: -3", "spec.requestsPerInterval in body should be greater than or equal to 1"},
		{"no rate", "host: shop.example.com", "spec.requestsPerInterval: Required value"},
		{"zero interval", "host: shop.example.com\nrequestsPerInterval: 1\ninterval: 0s", "spec.interval must be a duration from 1ms to 24h"},
		{"negative interval", "host: shop.example.com\nrequestsPerInterval: 1\ninterval: -1s", "spec.interval must be a duration from 1ms to 24h"},
		{"zero burst", "host: shop.example.com\nrequestsPerInterval: 1\nburst: 0", "spec.burst in body should be greater than or equal to 1"},
		{"zero concurrency", "host: shop.example.com\nrequestsPerInterval: 1\nmaxConcurrentPerIP: 0", "spec.maxConcurrentPerIP in body should be greater than or equal to 1"},
		{"zero fleet cap", "host: shop.example.com\nrequestsPerInterval: 1\nfleetRequestsPerInterval: 0", "spec.fleetRequestsPerInterval in body should be greater than or equal to 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(ctx, crawlTargetFromSpec(t, tc.spec))
			require.Error(t, err, "the API server accepted an invalid CrawlTarget")
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	u := crawlTargetFromSpec(t, "host: '*.shop.example.com'\nrequestsPerInterval: 4\nmaxConcurrentPerIP: 2\nfleetRequestsPerInterval: 40")
	require.NoError(t, env.Client.Create(ctx, u))
	var ct crawlv1alpha1.CrawlTarget
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(u), &ct))
	assert.Equal(t, time.Second, ct.Spec.Interval.Duration, "interval defaults to 1s")
	assert.Equal(t, time.Second, ct.Window())
	assert.Nil(t, ct.Spec.Burst, "no burst unless asked: the window bound")
}

func TestCrawlTargetMatches(t *testing.T) {
	exact := &crawlv1alpha1.CrawlTarget{Spec: crawlv1alpha1.CrawlTargetSpec{Host: "shop.example.com"}}
	wild := &crawlv1alpha1.CrawlTarget{Spec: crawlv1alpha1.CrawlTargetSpec{Host: "*.example.com"}}
	wilder := &crawlv1alpha1.CrawlTarget{Spec: crawlv1alpha1.CrawlTargetSpec{Host: "*.shop.example.com"}}
	assert.Positive(t, exact.Matches("shop.example.com"))
	assert.Zero(t, exact.Matches("www.shop.example.com"))
	assert.Zero(t, wild.Matches("example.com"), "a wildcard covers the hosts below its domain, not the domain")
	assert.Zero(t, wild.Matches("badexample.com"))
	assert.Positive(t, wild.Matches("a.b.example.com"))
	assert.Greater(t, exact.Matches("shop.example.com"), wilder.Matches("x.shop.example.com"))
	assert.Greater(t, wilder.Matches("x.shop.example.com"), wild.Matches("x.shop.example.com"), "the longer wildcard is more specific")
}
