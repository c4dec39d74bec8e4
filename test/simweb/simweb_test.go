package simweb

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// from is a client whose requests leave from ip, as a proxy's would.
func from(s *Site, ip string) *http.Client {
	c := s.Client()
	tr := c.Transport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext
	tr.DisableKeepAlives = true
	c.Transport = tr
	return c
}

func fetch(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestSiteAppliesItsRulesPerExitIP(t *testing.T) {
	clock := time.Unix(1000, 0)
	var mu sync.Mutex
	rules := Rules{RatePerSecond: 1, Burst: 2, BanAfter: 3, BanWindow: Duration(time.Minute), BanFor: Duration(time.Hour),
		Blocked: []string{"127.0.40.3"}, SoftBlocked: []string{"127.0.40.4"}}
	s, err := Start("127.0.40.100", true, rules)
	require.NoError(t, err)
	defer s.Close()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	a, b := from(s, "127.0.40.1"), from(s, "127.0.40.2")
	// The burst passes, then the rate holds: the third request at once is
	// a 429 whose Retry-After says when a token is back.
	for range 2 {
		code, body := fetch(t, a, s.URL+"/p")
		require.Equal(t, http.StatusOK, code)
		assert.False(t, IsBlockPage([]byte(body)))
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, s.URL+"/p", nil)
	resp, err := a.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	// Another IP has a bucket of its own.
	code, _ := fetch(t, b, s.URL+"/p")
	assert.Equal(t, http.StatusOK, code)
	// A token is back after a second.
	advance(time.Second)
	code, _ = fetch(t, a, s.URL+"/p")
	assert.Equal(t, http.StatusOK, code)
	// Two more violations within the window ban the IP: 403 even once its
	// bucket is full again, and the site remembers it burned.
	for range 2 {
		code, _ = fetch(t, a, s.URL+"/p")
		assert.Equal(t, http.StatusTooManyRequests, code)
	}
	advance(10 * time.Second)
	code, _ = fetch(t, a, s.URL+"/p")
	assert.Equal(t, http.StatusForbidden, code)

	code, _ = fetch(t, from(s, "127.0.40.3"), s.URL+"/p")
	assert.Equal(t, http.StatusForbidden, code, "a blocked IP")
	code, body := fetch(t, from(s, "127.0.40.4"), s.URL+"/p")
	assert.Equal(t, http.StatusOK, code, "a soft block answers 200")
	assert.True(t, IsBlockPage([]byte(body)))

	st := s.Stats()
	assert.Equal(t, []string{"127.0.40.1"}, st.Banned)
	assert.Equal(t, map[string]int{AnswerPage: 4, AnswerLimited: 3, AnswerBanned: 1, AnswerBlocked: 1, AnswerSoftBlock: 1}, st.Answers)
	assert.Equal(t, 4, st.Pages())
	assert.Equal(t, 6, st.Wasted())

	// The rules are published as the site applies them.
	code, body = fetch(t, b, s.URL+RulesPath)
	require.Equal(t, http.StatusOK, code)
	var published Rules
	require.NoError(t, json.Unmarshal([]byte(body), &published))
	assert.Equal(t, rules, published)
}

func TestSiteLimitsConcurrencyAndHidesViolations(t *testing.T) {
	s, err := Start("127.0.40.101", false, Rules{MaxConcurrent: 1, SoftViolations: true, Latency: Duration(300 * time.Millisecond)})
	require.NoError(t, err)
	defer s.Close()
	c := from(s, "127.0.40.1")
	results := make(chan string, 2)
	for range 2 {
		go func() {
			_, body := fetch(t, c, s.URL+"/slow")
			results <- body
		}()
	}
	blocked := 0
	for range 2 {
		if IsBlockPage([]byte(<-results)) {
			blocked++
		}
	}
	assert.Equal(t, 1, blocked, "the second request in flight is a violation, answered with a block page")
	assert.Equal(t, map[string]int{AnswerPage: 1, AnswerSoftBlock: 1}, s.Stats().Answers)
}

func TestOracle(t *testing.T) {
	ips := []string{"a", "b", "c", "d"}
	nets := []string{"127.0.1.1", "127.0.1.2", "127.0.2.1"}
	assert.Equal(t, 2*(1+20), Oracle(Rules{RatePerSecond: 2, CountBy: CountByNetwork}, nets, 10*time.Second, 1000), "per network: two /24s")
	for _, tc := range []struct {
		name   string
		rules  Rules
		d      time.Duration
		demand int
		want   int
	}{
		{"no rules: the demand", Rules{}, time.Minute, 500, 500},
		{"burst then rate, per usable IP", Rules{RatePerSecond: 2, Burst: 4, Blocked: []string{"a"}, SoftBlocked: []string{"b"}}, 10 * time.Second, 1000, 2 * (4 + 20)},
		{"the demand bounds it", Rules{RatePerSecond: 2, Burst: 4}, 10 * time.Second, 50, 50},
		{"concurrency over latency bounds it", Rules{RatePerSecond: 100, MaxConcurrent: 1, Latency: Duration(500 * time.Millisecond)}, 10 * time.Second, 1000, 4 * 20},
		{"a sliding window: PerWindow in each", Rules{PerWindow: 3, Window: Duration(2 * time.Second)}, 10 * time.Second, 1000, 4 * 15},
		{"a fixed window may start anew at once: one more", Rules{PerWindow: 3, Window: Duration(2 * time.Second), FixedWindow: true}, 10 * time.Second, 1000, 4 * 18},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Oracle(tc.rules, ips, tc.d, tc.demand))
		})
	}
}

// TestSiteCountsASlidingWindow: a site that counts PerWindow in any Window
// per IP lets that many through at once, refuses one more until the
// oldest leaves the window (not at the window's start: it slides), and
// counts each IP apart.
func TestSiteCountsASlidingWindow(t *testing.T) {
	clock := time.Unix(1000, 0)
	var mu sync.Mutex
	s, err := Start("127.0.40.101", true, Rules{PerWindow: 2, Window: Duration(time.Second)})
	require.NoError(t, err)
	defer s.Close()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	a, b := from(s, "127.0.40.5"), from(s, "127.0.40.6")
	code, _ := fetch(t, a, s.URL+"/1")
	require.Equal(t, http.StatusOK, code)
	advance(600 * time.Millisecond)
	code, _ = fetch(t, a, s.URL+"/2")
	require.Equal(t, http.StatusOK, code)
	advance(300 * time.Millisecond)
	code, _ = fetch(t, a, s.URL+"/3")
	assert.Equal(t, http.StatusTooManyRequests, code, "three within one second")
	code, _ = fetch(t, b, s.URL+"/1")
	assert.Equal(t, http.StatusOK, code, "another IP is counted apart")
	advance(100 * time.Millisecond)
	code, _ = fetch(t, a, s.URL+"/3")
	assert.Equal(t, http.StatusOK, code, "the first left the window: it slides")
	advance(100 * time.Millisecond)
	code, _ = fetch(t, a, s.URL+"/4")
	assert.Equal(t, http.StatusTooManyRequests, code, "the second is still in it")
}

// TestSiteCountsFixedWindowsAndNetworks: a fixed window lets PerWindow
// through from its start, refuses one more until the next window begins
// (it does not slide), and a site that counts by network counts a /24's
// IPs as one.
func TestSiteCountsFixedWindowsAndNetworks(t *testing.T) {
	clock := time.Unix(1000, 0)
	var mu sync.Mutex
	s, err := Start("127.0.40.102", true, Rules{PerWindow: 2, Window: Duration(time.Second), FixedWindow: true, CountBy: CountByNetwork})
	require.NoError(t, err)
	defer s.Close()
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	a, b, other := from(s, "127.0.40.7"), from(s, "127.0.40.8"), from(s, "127.0.41.7")
	advance(900 * time.Millisecond)
	code, _ := fetch(t, a, s.URL+"/1")
	require.Equal(t, http.StatusOK, code)
	code, _ = fetch(t, b, s.URL+"/1")
	require.Equal(t, http.StatusOK, code)
	code, _ = fetch(t, a, s.URL+"/2")
	assert.Equal(t, http.StatusTooManyRequests, code, "the /24's two in this window are spent, whichever IP sent them")
	code, _ = fetch(t, other, s.URL+"/1")
	assert.Equal(t, http.StatusOK, code, "another /24 is counted apart")
	advance(100 * time.Millisecond)
	for _, c := range []*http.Client{a, b} {
		code, _ = fetch(t, c, s.URL+"/3")
		assert.Equal(t, http.StatusOK, code, "a new window: two more at once (a fixed window does not slide)")
	}
}
