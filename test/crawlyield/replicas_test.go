package crawlyield

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease/redisstore"
	"github.com/example/egress-proxies-operator/test/redisserver"
	"github.com/example/egress-proxies-operator/test/simweb"
)

// strictRules are sites whose every excess is visible: a 429 for one
// request over the rate or the connection limit, a ban after three.
func strictRules(n int) []simweb.Rules {
	r := simweb.Rules{RatePerSecond: 5, Burst: 3, MaxConcurrent: 2, BanAfter: 3,
		BanWindow: simweb.Duration(time.Minute), BanFor: simweb.Duration(time.Hour), Latency: simweb.Duration(10 * time.Millisecond)}
	out := make([]simweb.Rules, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// TestPolicyHoldsAcrossReplicas: two replicas (discovery and gateway each)
// share a real Redis; 32 crawlers on each, 64 in all, crawl two sites with
// policies a little under their rules (policiesUnder). No IP exceeds its budget on either site:
// not one 429, no ban; and both replicas' crawlers got pages.
func TestPolicyHoldsAcrossReplicas(t *testing.T) {
	const block = 64
	w := startWeb(t, block, 4, strictRules(2), 0)
	srv := redisserver.Start(t, "")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	t.Cleanup(func() { _ = rdb.Close() })
	politeness := broker.Politeness{Policies: policiesUnder(t, w, 0.8), Adaptive: true}
	replicas := []*product{
		startReplica(t, w, politeness, redisstore.New(redisstore.Options{Client: rdb})),
		startReplica(t, w, politeness, redisstore.New(redisstore.Options{Client: rdb})),
	}
	const workers = 64
	fetchers := []fetcher{throughGateway(w, replicas[0], workers, false), throughGateway(w, replicas[1], workers, false)}
	var perReplica [2]atomic.Int64
	r := crawl(w, urlsOf(w, 500), workers, 4*time.Second, func(ctx context.Context, worker int, rawURL string) (outcome, time.Duration) {
		o, retry := fetchers[worker%2](ctx, worker, rawURL)
		if o == gotPage {
			perReplica[worker%2].Add(1)
		}
		return o, retry
	})
	t.Logf("pages %d (%d and %d by replica), wasted %d, held %d", r.pages, perReplica[0].Load(), perReplica[1].Load(), r.wasted, r.held)
	for _, s := range w.sites {
		st := s.Stats()
		assert.Zero(t, st.Answers[simweb.AnswerLimited], "site %s answered 429: an IP went over its budget", s.Host)
		assert.Empty(t, st.Banned, "site %s banned an IP", s.Host)
		assert.Positive(t, st.Pages(), "site %s served pages", s.Host)
	}
	assert.Positive(t, perReplica[0].Load())
	assert.Positive(t, perReplica[1].Load())
	assert.Zero(t, r.wasted)
}

// TestAScrapySpiderCrawlsPolitely runs a real Scrapy spider (Debian's
// python3-scrapy) with 16 requests in flight through the gateway, with a
// policy per site a little under its rules and one request per tunnel
// (Connection: close, as docs/crawlers.md advises for exact pacing): every
// page arrives and no site answers a single 429.
func TestAScrapySpiderCrawlsPolitely(t *testing.T) {
	scrapy, err := exec.LookPath("scrapy")
	require.NoError(t, err, "Scrapy is missing: apt-get install -y python3-scrapy")
	const block = 66
	w := startWeb(t, block, 3, strictRules(2), 1)
	p := startProduct(t, w, broker.Politeness{Policies: policiesUnder(t, w, 0.8), Adaptive: true})
	const pages = 30
	out := filepath.Join(t.TempDir(), "pages.jsonl")
	gw := fmt.Sprintf("http://spider-1:%s@%s", token, p.gwAddr)
	starts := w.sites[0].URL + "/," + w.sites[1].URL + "/"
	cmd := exec.Command(scrapy, "runspider", filepath.Join("..", "..", "gateway", "testdata", "spider.py"),
		"-a", "gateway="+gw, "-a", "api="+p.api.URL, "-a", "token="+token, "-a", "session=spider-1",
		"-a", "start="+starts, "-a", "pages="+strconv.Itoa(pages), "-s", "CONCURRENT_REQUESTS=16",
		"-s", `DEFAULT_REQUEST_HEADERS={"Connection": "close"}`, "-O", out)
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "NO_PROXY=*")
	logs, err := cmd.CombinedOutput()
	require.NoError(t, err, "scrapy failed:\n%s", logs)
	got := readItems(t, out)
	for _, s := range w.sites {
		for i := range pages {
			assert.True(t, got[s.URL+"/page/"+strconv.Itoa(i)], "page %d of %s did not arrive; spider log:\n%s", i, s.URL, logs)
		}
		st := s.Stats()
		assert.Zero(t, st.Answers[simweb.AnswerLimited], "site %s answered 429", s.Host)
		assert.Empty(t, st.Banned)
	}
}
