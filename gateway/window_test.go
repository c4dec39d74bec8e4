package gateway_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
)

// TestScrapyKeepsASlidingWindowThroughTheGateway: a real Scrapy spider,
// with its default kept-alive connections, crawls a site that bans an IP
// at its first request over 2 in any second (a sliding log), through the
// gateway with a CrawlTarget of the site's published numbers: every page
// comes, and no IP is banned.
func TestScrapyKeepsASlidingWindowThroughTheGateway(t *testing.T) {
	scrapy, err := exec.LookPath("scrapy")
	require.NoError(t, err, "Scrapy is missing: apt-get install -y python3-scrapy")
	site, err := simweb.Start("127.0.0.84", true, simweb.Rules{PerWindow: 2, Window: simweb.Duration(time.Second),
		BanAfter: 1, BanWindow: simweb.Duration(time.Minute), BanFor: simweb.Duration(time.Hour)})
	require.NoError(t, err)
	t.Cleanup(site.Close)
	f := newFixtureWith(t, gateway.Options{PaceWait: 30 * time.Second}, clock.RealClock{}, squid.DefaultRules, func(o *discovery.Options) {
		host := "127.0.0.84"
		o.Politeness = broker.Politeness{Policies: lazyPolicy{host: &host, n: 2}}
	})
	const pages = 10
	out := filepath.Join(t.TempDir(), "pages.jsonl")
	cmd := exec.Command(scrapy, "runspider", filepath.Join("testdata", "spider.py"),
		"-a", "gateway="+f.proxyURL("window-1").String(), "-a", "api="+f.api.URL, "-a", "token="+token, "-a", "session=window-1",
		"-a", "start="+site.URL+"/", "-a", "pages="+strconv.Itoa(pages), "-O", out)
	cmd.Dir = "."
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "NO_PROXY=*")
	logs, err := cmd.CombinedOutput()
	require.NoError(t, err, "scrapy failed:\n%s", logs)

	file, err := os.Open(out)
	require.NoError(t, err)
	defer file.Close()
	got := 0
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		var item struct{ URL, Body string }
		require.NoError(t, json.Unmarshal(scanner.Bytes(), &item))
		assert.Contains(t, item.Body, "page /page/")
		got++
	}
	require.NoError(t, scanner.Err())
	stats := site.Stats()
	assert.Equal(t, pages, got, "every page came; spider log:\n%s", logs)
	assert.Empty(t, stats.Banned, "no IP went over the site's window")
	assert.Equal(t, pages, stats.Pages(), "answers: %v", stats.Answers)
}
