package discovery

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestPolitenessAPI: a paced lease reserves its slot and says when it may
// go; a lease that may not wait is refused 429 target_paced with
// Retry-After; a rate_limited report teaches a host without a policy its
// pace; GET /v1/targets/{host} shows both; bad input is refused.
func TestPolitenessAPI(t *testing.T) {
	f := newFixture(t)
	index := broker.NewPolicyIndex()
	index.Handler().OnAdd(testenv.CrawlTarget("crawl", "shop", "shop.example", 1, f.clock.Now()), false)
	f.configure(func(o *Options) { o.Politeness = broker.Politeness{Policies: index, Adaptive: true} })
	f.proxy("eu-1", "127.0.0.11", true, nil)

	// One request in any second per proxy: the first goes now, the second
	// one spacing later (a second and the 5% jitter allowance) when it may
	// wait, and not at all when not.
	first := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, first.status, first.raw)
	assert.Equal(t, true, first.body["paced"])
	assert.Nil(t, first.body["nextRequestAt"], "a slot free now")
	waiting := f.do("POST", "/v1/leases", `{"target":"shop.example","maxWaitSeconds":5}`)
	require.Equal(t, http.StatusCreated, waiting.status, waiting.raw)
	assert.Equal(t, f.clock.Now().Add(lease.WindowPace(1, time.Second)).Format(time.RFC3339Nano), waiting.body["nextRequestAt"])
	again := f.do("GET", "/v1/leases/"+waiting.body["leaseID"].(string), "")
	require.Equal(t, http.StatusOK, again.status)
	assert.Nil(t, again.body["nextRequestAt"], "only the answer that created it says how it was paced, as on every store")
	assert.Nil(t, again.body["paced"])
	refused := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
	assert.Equal(t, http.StatusTooManyRequests, refused.status)
	assert.Equal(t, CodeTargetPaced, errorCode(refused))
	assert.Equal(t, "3", refused.header.Get("Retry-After"), "two reserved slots ahead (2.1s, rounded up)")
	assert.Contains(t, errorMessage(refused), `target "shop.example"`)
	unpaced := f.do("POST", "/v1/leases", `{"target":"news.example"}`)
	require.Equal(t, http.StatusCreated, unpaced.status)
	assert.Nil(t, unpaced.body["paced"], "a host no policy names is not paced")

	for _, bad := range []string{`{"target":"shop.example","maxWaitSeconds":-1}`, `{"target":"shop.example","maxWaitSeconds":61}`} {
		r := f.do("POST", "/v1/leases", bad)
		assert.Equal(t, http.StatusBadRequest, r.status, bad)
		assert.Contains(t, errorMessage(r), "maxWaitSeconds must be between 0 and 60")
	}

	// news.example pushes back: its learned pace is the site's Retry-After.
	id := unpaced.body["leaseID"].(string)
	r := f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"news.example","retryAfterSeconds":3}`)
	require.Equal(t, http.StatusNoContent, r.status, r.raw)
	news := f.do("GET", "/v1/targets/News.Example.:443", "")
	require.Equal(t, http.StatusOK, news.status, news.raw)
	assert.Equal(t, "news.example", news.body["host"])
	assert.Empty(t, news.body["policies"])
	learned := news.body["learned"].(map[string]any)
	assert.InDelta(t, 3.0, learned["intervalSeconds"], 0.001)
	assert.InDelta(t, 1.0, learned["pushBacks"], 0)

	shop := f.do("GET", "/v1/targets/shop.example", "")
	require.Equal(t, http.StatusOK, shop.status)
	policies := shop.body["policies"].([]any)
	require.Len(t, policies, 1)
	assert.Equal(t, "crawl/shop", policies[0].(map[string]any)["name"])
	assert.InDelta(t, 1/1.05, policies[0].(map[string]any)["requestsPerSecondPerIP"], 0.001, "what each IP sends: 1 in any second, spaced with the jitter allowance")
	assert.Nil(t, shop.body["learned"])

	bad := f.do("GET", "/v1/targets/"+strings.Repeat("x", 254), "")
	assert.Equal(t, http.StatusBadRequest, bad.status)

	// The learned-pace metric covers the hosts policies name, no others.
	c := f.srv.Broker().LearnedPaceCollector(index, time.Second)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.Equal(t, 1, testutil.CollectAndCount(c), "one series: shop.example")
}

// TestASessionWaitsForItsOwnPacedProxy: a session's own proxy held back by
// its host's pace is skipped for another; when there is no other, the
// tunnel waits for its own slot within its wait, and beyond it is told the
// host is paced (a 429 at the gateway), never that no proxy matches.
func TestASessionWaitsForItsOwnPacedProxy(t *testing.T) {
	f := newFixture(t)
	index := broker.NewPolicyIndex()
	index.Handler().OnAdd(testenv.CrawlTarget("crawl", "shop", "shop.example", 1, f.clock.Now()), false) // 1/s per IP
	f.configure(func(o *Options) { o.Politeness = broker.Politeness{Policies: index, Adaptive: true} })
	f.proxy("eu-1", "127.0.0.11", true, nil)
	tunnels := f.srv.Tunnels()
	pick := func(maxWait time.Duration) (broker.Upstream, error) {
		return tunnels.Tunnel(context.Background(), broker.TunnelRequest{Session: "s1", Host: "shop.example", TTL: time.Minute, SessionIdle: time.Minute, MaxWait: maxWait})
	}
	first, err := pick(0)
	require.NoError(t, err)
	assert.Zero(t, first.Wait)
	waited, err := pick(5 * time.Second)
	require.NoError(t, err, "its own proxy's slot comes within the wait")
	assert.Equal(t, "crawl/eu-1", waited.ProxyID)
	assert.Equal(t, lease.WindowPace(1, time.Second), waited.Wait)
	_, err = pick(0)
	var none *lease.NoProxyAvailableError
	require.ErrorAs(t, err, &none)
	assert.Equal(t, lease.CausePaced, none.Cause, "the host is paced: the gateway answers 429 with when to come back")
	assert.Equal(t, 2*lease.WindowPace(1, time.Second), none.RetryAfter)
}
