package gateway_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/gateway"
)

// TestAScrapySpiderCrawlsThroughTheGateway runs a real Scrapy spider
// (Debian's python3-scrapy) through the gateway over two local HTTPS sites.
// The first site rate-limits the first upstream that reaches it; the spider
// reports that to the discovery API by session and tries again. Every page
// must arrive, through more than one upstream, and no request to the first
// site may arrive through the upstream cooling down for it once the report
// was taken (Scrapy has a few in flight by then: those get 429 too).
func TestAScrapySpiderCrawlsThroughTheGateway(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	f.sites[0].mu.Lock()
	f.sites[0].limitFirst = true
	f.sites[0].mu.Unlock()
	const pages = 8
	got, logs := runSpider(t, f, "spider-1", pages, f.sites[0].srv.URL, f.sites[1].srv.URL)
	for _, s := range f.sites {
		for i := range pages {
			assert.Contains(t, got, s.srv.URL+"/page/"+strconv.Itoa(i), "page %d of %s did not arrive; spider log:\n%s", i, s.srv.URL, logs)
		}
	}

	f.sites[0].mu.Lock()
	limited, cut := f.sites[0].limited, f.sites[0].reportedAt
	f.sites[0].mu.Unlock()
	require.NotEmpty(t, limited, "the first site saw a request")
	first := f.sites[0].upstreams()
	require.Positive(t, cut, "the spider reported the 429")
	t.Logf("the rate-limited site saw, by upstream: %v; the report came after %d of them", first, cut)
	for i := cut; i < len(first); i++ {
		assert.NotEqual(t, limited, first[i], "request %d to the rate-limited site, after the report, came through the upstream cooling down for it: %v", i, first)
	}
	used := map[string]bool{}
	for _, s := range f.sites {
		for _, up := range s.upstreams() {
			used[up] = true
		}
	}
	assert.Greater(t, len(used), 1, "pages came through one upstream only: %v", used)
	refused := 0
	for _, up := range first {
		if up == limited {
			refused++
		}
	}
	assert.Len(t, first, pages+refused, "every page once, plus the 429s")
	f.sites[1].mu.Lock()
	assert.Empty(t, f.sites[1].limited)
	f.sites[1].mu.Unlock()
}

// runSpider runs the Scrapy spider of testdata (Debian's python3-scrapy,
// with its default kept-alive connections) through f's gateway as session
// over pages of each site in starts, and returns the bodies of the pages
// it got, by URL, with its log. Each body must be a page.
func runSpider(t *testing.T, f *fixture, session string, pages int, starts ...string) (map[string]string, []byte) {
	t.Helper()
	scrapy, err := exec.LookPath("scrapy")
	require.NoError(t, err, "Scrapy is missing: apt-get install -y python3-scrapy")
	for i := range starts {
		starts[i] += "/"
	}
	out := filepath.Join(t.TempDir(), "pages.jsonl")
	cmd := exec.Command(scrapy, "runspider", filepath.Join("testdata", "spider.py"),
		"-a", "gateway="+f.proxyURL(session).String(), "-a", "api="+f.api.URL, "-a", "token="+token, "-a", "session="+session,
		"-a", "start="+strings.Join(starts, ","), "-a", "pages="+strconv.Itoa(pages), "-O", out)
	cmd.Dir = "."
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "NO_PROXY=*")
	logs, err := cmd.CombinedOutput()
	require.NoError(t, err, "scrapy failed:\n%s", logs)

	file, err := os.Open(out)
	require.NoError(t, err)
	defer file.Close()
	got := map[string]string{}
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		var item struct{ URL, Body string }
		require.NoError(t, json.Unmarshal(scanner.Bytes(), &item))
		assert.Contains(t, item.Body, "page /page/")
		got[item.URL] = item.Body
	}
	require.NoError(t, scanner.Err())
	return got, logs
}
