package gateway_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	scrapy, err := exec.LookPath("scrapy")
	require.NoError(t, err, "Scrapy is missing: apt-get install -y python3-scrapy")
	f := newFixture(t, gateway.Options{})
	f.sites[0].mu.Lock()
	f.sites[0].limitFirst = true
	f.sites[0].mu.Unlock()
	const pages = 8
	out := filepath.Join(t.TempDir(), "pages.jsonl")
	cmd := exec.Command(scrapy, "runspider", filepath.Join("testdata", "spider.py"),
		"-a", "gateway="+f.proxyURL("spider-1").String(), "-a", "api="+f.api.URL, "-a", "token="+token, "-a", "session=spider-1",
		"-a", "start="+f.sites[0].srv.URL+"/,"+f.sites[1].srv.URL+"/", "-a", "pages="+strconv.Itoa(pages), "-O", out)
	cmd.Dir = "."
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=", "NO_PROXY=*")
	logs, err := cmd.CombinedOutput()
	require.NoError(t, err, "scrapy failed:\n%s", logs)

	file, err := os.Open(out)
	require.NoError(t, err)
	defer file.Close()
	got := map[string]bool{}
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		var item struct{ URL, Body string }
		require.NoError(t, json.Unmarshal(scanner.Bytes(), &item))
		assert.Contains(t, item.Body, "page /page/")
		got[item.URL] = true
	}
	require.NoError(t, scanner.Err())
	for _, s := range f.sites {
		for i := range pages {
			assert.True(t, got[s.srv.URL+"/page/"+strconv.Itoa(i)], "page %d of %s did not arrive; spider log:\n%s", i, s.srv.URL, logs)
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
