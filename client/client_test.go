package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/client"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const token = "client-token"

// fixture is the real discovery server (memory store) over a view holding
// two External proxies, each a real Squid on loopback, and a local HTTPS
// site that answers 429 with a Retry-After on /limited.
type fixture struct {
	c       *client.Client
	view    *broker.View
	proxies map[string]*crawlv1alpha1.Proxy // by id
	squids  map[string]*squid.Squid         // by proxy id
	site    *httptest.Server
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, broker.Politeness{})
}

// newFixtureWith is newFixture with the discovery server's politeness.
func newFixtureWith(t *testing.T, politeness broker.Politeness) *fixture {
	t.Helper()
	f := &fixture{view: broker.NewView(nil, "operator-ns"), proxies: map[string]*crawlv1alpha1.Proxy{}, squids: map[string]*squid.Squid{}}
	api := httptest.NewServer(discovery.NewServer(discovery.Options{
		Store: lease.NewMemoryStore(nil), View: f.view, Tokens: discovery.StaticToken(token),
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: time.Minute,
		Politeness: politeness,
	}).Handler())
	t.Cleanup(api.Close)
	var err error
	f.c, err = client.New(api.URL, token)
	require.NoError(t, err)
	for i, name := range []string{"a", "b"} {
		sq := squid.Start(t, squid.Config{Address: fmt.Sprintf("127.0.0.%d", 61+i), Port: 3128})
		host, port, _ := net.SplitHostPort(sq.Addr)
		p := &crawlv1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "local"},
				External: &crawlv1alpha1.ExternalEndpoint{Address: host}},
			Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: host, Port: int32(mustAtoi(t, port))},
		}
		testenv.SetHealth(p, metav1.ConditionTrue, "ProbeSucceeded")
		f.view.Handler().OnAdd(p, false)
		f.proxies["crawl/"+name], f.squids["crawl/"+name] = p, sq
	}
	f.site = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "hello from "+r.Host)
	}))
	f.site.StartTLS()
	t.Cleanup(f.site.Close)
	return f
}

func mustAtoi(t *testing.T, s string) int {
	var n int
	_, err := fmt.Sscanf(s, "%d", &n)
	require.NoError(t, err)
	return n
}

// transport is a client.Transport whose requests trust the local site.
func (f *fixture) transport(ttl time.Duration) *client.Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.TLSClientConfig = f.site.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	return &client.Transport{Client: f.c, Selector: map[string]string{"geo": "local"}, TTL: ttl, Base: base}
}

// siteURL is a URL of the local site.
func (f *fixture) siteURL(path string) string { return f.site.URL + path }

func TestLeaseRenewReportRelease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l, err := f.c.Lease(ctx, client.LeaseRequest{Selector: map[string]string{"geo": "local"}, Target: "shop.example", TTL: time.Minute})
	require.NoError(t, err)
	u, err := l.ProxyURL()
	require.NoError(t, err)
	assert.Equal(t, f.squids[l.Proxy.ID].Addr, u.Host, "the lease's URL is its proxy's")
	assert.Equal(t, "active", l.State)

	renewed, err := f.c.Renew(ctx, l.ID, 10*time.Minute)
	require.NoError(t, err)
	assert.True(t, renewed.ExpiresAt.After(l.ExpiresAt))

	// A site's 429 with an HTTP-date Retry-After, reported: that proxy is
	// not leased for that site again, the other one is.
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {time.Now().Add(10 * time.Minute).UTC().Format(http.TimeFormat)}},
		Request: httptest.NewRequest(http.MethodGet, "https://shop.example/cart", nil)}
	report := client.ReportOf(resp, time.Now())
	assert.Equal(t, client.ResultRateLimited, report.Result)
	assert.Equal(t, "shop.example", report.Target)
	assert.InDelta(t, (10 * time.Minute).Seconds(), report.RetryAfter.Seconds(), 2)
	require.NoError(t, f.c.Report(ctx, l.ID, report))
	other, err := f.c.Lease(ctx, client.LeaseRequest{Target: "shop.example"})
	require.NoError(t, err)
	assert.NotEqual(t, l.Proxy.ID, other.Proxy.ID)
	_, err = f.c.Lease(ctx, client.LeaseRequest{Selector: map[string]string{"geo": "local"}, Target: "shop.example"})
	require.NoError(t, err, "the other proxy takes a second lease")
	require.NoError(t, f.c.Report(ctx, other.ID, client.Report{Result: client.ResultRateLimited, Target: "shop.example", RetryAfter: 5 * time.Minute}))
	_, err = f.c.Lease(ctx, client.LeaseRequest{Target: "shop.example"})
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, client.CodeNoProxyAvailable, apiErr.Code)
	assert.InDelta(t, (5 * time.Minute).Seconds(), apiErr.RetryAfter.Seconds(), 2, "the first cooldown's end")

	require.NoError(t, f.c.Release(ctx, l.ID))
	require.NoError(t, f.c.Release(ctx, l.ID), "releasing twice is fine")
	_, err = f.c.Get(ctx, l.ID)
	assert.True(t, client.HasCode(err, client.CodeLeaseNotFound), "%v", err)

	wrong, err := client.New(f.c.String(), "wrong-token")
	require.NoError(t, err)
	_, err = wrong.Lease(ctx, client.LeaseRequest{})
	assert.True(t, client.HasCode(err, client.CodeUnauthorized), "%v", err)
}

// TestExclusiveLease: an exclusive lease holds a proxy alone; with every
// proxy held or in use, the next is refused with when to come back.
func TestExclusiveLease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var held []*client.Lease
	for {
		l, err := f.c.Lease(ctx, client.LeaseRequest{Exclusive: true, TTL: time.Minute})
		var apiErr *client.APIError
		if errors.As(err, &apiErr) {
			assert.Equal(t, client.CodeNoProxyAvailable, apiErr.Code)
			assert.Positive(t, apiErr.RetryAfter)
			break
		}
		require.NoError(t, err)
		assert.True(t, l.Exclusive)
		held = append(held, l)
		require.LessOrEqual(t, len(held), len(f.squids), "one exclusive lease a proxy")
	}
	require.Len(t, held, len(f.squids), "every proxy held once")
	require.NoError(t, f.c.Release(ctx, held[0].ID))
	again, err := f.c.Lease(ctx, client.LeaseRequest{})
	require.NoError(t, err, "a released hold frees its proxy")
	assert.Equal(t, held[0].Proxy.ID, again.Proxy.ID)
}

// TestHoldRenewsAcrossTTLs: a held lease outlives many TTLs, and is gone
// once released.
func TestHoldRenewsAcrossTTLs(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	held, err := f.c.Hold(ctx, client.LeaseRequest{TTL: time.Second})
	require.NoError(t, err)
	first := held.Lease()
	time.Sleep(3500 * time.Millisecond) // three and a half TTLs
	got, err := f.c.Get(ctx, first.ID)
	require.NoError(t, err, "renewed in the background")
	assert.True(t, got.ExpiresAt.After(first.ExpiresAt.Add(2*time.Second)))
	select {
	case <-held.Lost():
		t.Fatalf("lost: %v", held.Err())
	default:
	}
	require.NoError(t, held.Release(ctx))
	require.NoError(t, held.Release(ctx), "twice is fine")
	_, err = f.c.Get(ctx, first.ID)
	assert.True(t, client.HasCode(err, client.CodeLeaseNotFound))
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"Fri, 04 Dec 2026 12:05:00 GMT", 5 * time.Minute, true},
		{"Friday, 04-Dec-26 12:00:30 GMT", 30 * time.Second, true}, // RFC 850, which RFC 9110 still accepts
		{"Fri Dec  4 12:01:00 2026", time.Minute, true},            // asctime
		{"Fri, 04 Dec 2026 11:00:00 GMT", 0, true},                 // past: now
		{"999999999", 24 * time.Hour, true},                        // capped as the API caps it
		{"-5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	} {
		got, ok := client.ParseRetryAfter(tc.header, now)
		assert.Equal(t, tc.ok, ok, "%q", tc.header)
		assert.Equal(t, tc.want, got, "%q", tc.header)
	}
}

// TestTransport: requests to a site stick to one proxy through real Squid;
// a 429 is reported and moves that site, and only that site, to the other
// proxy; Close releases every lease.
func TestTransport(t *testing.T) {
	f := newFixture(t)
	tr := f.transport(time.Minute)
	web := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(url string) (int, string) {
		resp, err := web.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	status, body := get(f.siteURL("/"))
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, "hello")
	host := strings.Split(strings.TrimPrefix(f.site.URL, "https://"), ":")[0]
	first := tr.Current(host)
	require.NotEmpty(t, first)
	for range 3 {
		status, _ = get(f.siteURL("/"))
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, first, tr.Current(host), "a site's requests stick to one proxy")
	}

	status, _ = get(f.siteURL("/limited"))
	assert.Equal(t, http.StatusTooManyRequests, status, "the site's answer reaches the caller")
	status, _ = get(f.siteURL("/"))
	assert.Equal(t, http.StatusOK, status)
	assert.NotEqual(t, first, tr.Current(host), "after a 429 the site goes through the other proxy")
	l, err := f.c.Lease(context.Background(), client.LeaseRequest{Selector: map[string]string{"geo": "local"}, Target: host})
	require.NoError(t, err)
	assert.NotEqual(t, first, l.Proxy.ID, "the API was told: the first proxy cools down for this site")
	require.NoError(t, f.c.Release(context.Background(), l.ID))

	require.NoError(t, tr.Close())
	assert.Empty(t, tr.Current(host))
	assert.Zero(t, activeLeases(t, f), "Close released every lease")
}

// TestTransportLeavesAProxyThatGoesAway: a proxy whose Squid dies mid-use
// is left at once and the request goes through another lease; a proxy
// deleted from the fleet is left at the next renewal.
func TestTransportLeavesAProxyThatGoesAway(t *testing.T) {
	f := newFixture(t)
	tr := f.transport(time.Second) // renewed every ~330ms
	defer tr.Close()
	web := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	host := strings.Split(strings.TrimPrefix(f.site.URL, "https://"), ":")[0]
	ok := func() {
		t.Helper()
		resp, err := web.Get(f.siteURL("/"))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	ok()
	dead := tr.Current(host)
	f.squids[dead].Stop()
	ok() // the same request goes through a new lease
	alive := tr.Current(host)
	assert.NotEqual(t, dead, alive, "moved off the dead Squid")

	// The fleet loses the proxy in use: the next renewal answers 409, and
	// the next request leases another. The dead one is gone from the fleet
	// too, and a new proxy, c, runs on its restarted Squid: c is the only
	// one left.
	f.view.Handler().OnDelete(f.proxies[dead])
	f.squids[dead] = squid.Start(t, squid.Config{Address: f.proxies[dead].Status.IP, Port: 3128})
	replacement := f.proxies[dead].DeepCopy()
	replacement.Name = "c"
	f.view.Handler().OnAdd(replacement, false)
	f.view.Handler().OnDelete(f.proxies[alive])
	require.Eventually(t, func() bool {
		ok()
		return tr.Current(host) == "crawl/c"
	}, 5*time.Second, 100*time.Millisecond, "re-leased after its proxy was deleted")
}

// activeLeases adds up every proxy's leases, as the API lists them.
func activeLeases(t *testing.T, f *fixture) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.c.String()+"/v1/proxies", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Proxies []client.Proxy `json:"proxies"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	n := 0
	for _, p := range body.Proxies {
		n += p.ActiveLeases
	}
	return n
}

// TestTransportRacingRequestsKeepOneLease: the first requests to a host, all
// at once, each lease outside the transport's lock; one lease is kept and
// the others are released.
func TestTransportRacingRequestsKeepOneLease(t *testing.T) {
	f := newFixture(t)
	tr := f.transport(time.Minute)
	defer tr.Close()
	web := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp, err := web.Get(f.siteURL("/"))
			if assert.NoError(t, err) {
				_ = resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	host := strings.Split(strings.TrimPrefix(f.site.URL, "https://"), ":")[0]
	assert.NotEmpty(t, tr.Current(host))
	assert.Eventually(t, func() bool { return activeLeases(t, f) == 1 }, 5*time.Second, 50*time.Millisecond,
		"one lease for the host; the racing ones released")
}

// onePolicy declares one pace for host, in every namespace.
type onePolicy struct {
	host string
	pace lease.Pace
}

func (o onePolicy) ForHost(host string) []broker.Policy {
	if host != o.host {
		return nil
	}
	return []broker.Policy{{Name: "crawl/site", Host: o.host, Pace: o.pace}}
}

// TestTransportPacesAPolicedHost: with a policy of one request per 400ms
// per proxy, a paced lease covers one request, the Transport waits for
// the slot its lease reserved, and every lease is released with its
// answer's body.
func TestTransportPacesAPolicedHost(t *testing.T) {
	host := "127.0.0.1"
	f := newFixtureWith(t, broker.Politeness{Policies: onePolicy{host: host, pace: lease.Pace{Interval: 400 * time.Millisecond, Burst: 1}}})
	var mu sync.Mutex
	var arrivals []time.Time
	inner := f.site.Config.Handler
	f.site.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
		inner.ServeHTTP(w, r)
	})
	tr := f.transport(time.Minute)
	web := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for range 4 {
		resp, err := web.Get(f.siteURL("/"))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Len(t, arrivals, 4)
	// Two proxies, one request each per 400ms: the third request waited
	// for the first proxy's next slot.
	assert.GreaterOrEqual(t, arrivals[2].Sub(arrivals[0]), 350*time.Millisecond, "the third request was not paced: %v", arrivals)
	assert.GreaterOrEqual(t, arrivals[3].Sub(arrivals[1]), 350*time.Millisecond, "the fourth request was not paced: %v", arrivals)
	assert.Empty(t, tr.Current(host), "a paced lease is not kept for the next request")
	assert.Zero(t, activeLeases(t, f), "each paced lease was released with its answer")

	// The API says so: a paced lease, and when its request may go.
	l, err := f.c.Lease(context.Background(), client.LeaseRequest{Target: host, MaxWait: 5 * time.Second})
	require.NoError(t, err)
	assert.True(t, l.Paced)
	require.NotNil(t, l.NextRequestAt, "both proxies sent a request moments ago: the slot is ahead")
	assert.True(t, l.NextRequestAt.After(time.Now().Add(-time.Second)))
	_, err = f.c.Lease(context.Background(), client.LeaseRequest{Target: host})
	var apiErr *client.APIError
	require.ErrorAs(t, err, &apiErr, "no wait allowed, no slot free now")
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	assert.Equal(t, discovery.CodeTargetPaced, apiErr.Code)
	assert.Positive(t, apiErr.RetryAfter)
	require.NoError(t, tr.Close())
}

// TestTransportHoldsLeasesOnlyForHostsInUse: a host's lease is released
// once it idles past IdleTimeout, at most MaxHosts are held at once (the
// least recently used goes first), and one host in two spellings is one
// lease.
func TestTransportHoldsLeasesOnlyForHostsInUse(t *testing.T) {
	f := newFixture(t)
	tr := f.transport(time.Minute)
	tr.Base.TLSClientConfig.InsecureSkipVerify = true // the site's certificate does not name localhost
	tr.MaxHosts = 1
	tr.IdleTimeout = 300 * time.Millisecond
	defer tr.Close()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(f.site.URL, "https://"))
	require.NoError(t, err)
	web := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(host string) {
		t.Helper()
		resp, err := web.Get("https://" + host + ":" + port + "/")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	// The site under two names; the transport cannot tell.
	get("localhost")
	get("LOCALHOST.")
	assert.Equal(t, 1, activeLeases(t, f), "localhost and LOCALHOST. are one host")
	assert.NotEmpty(t, tr.Current("Localhost"))

	get("127.0.0.1")
	assert.Empty(t, tr.Current("localhost"), "beyond MaxHosts the least recently used host's lease goes")
	assert.NotEmpty(t, tr.Current("127.0.0.1"))
	require.Eventually(t, func() bool { return activeLeases(t, f) == 1 }, 5*time.Second, 20*time.Millisecond, "and is released in the API")

	require.Eventually(t, func() bool { return activeLeases(t, f) == 0 }, 5*time.Second, 20*time.Millisecond,
		"a host with no request for IdleTimeout holds no lease")
	assert.Empty(t, tr.Current("127.0.0.1"))
	get("localhost")
	assert.Equal(t, 1, activeLeases(t, f), "a host that comes back leases again")
}

// TestTheSessionAddressHeaderIsTheProxies: the header a lease's client
// names a session address in is the one the proxies' Squid reads.
func TestTheSessionAddressHeaderIsTheProxies(t *testing.T) {
	assert.Equal(t, netid.SessionHeader, client.SessionAddressHeader)
}
