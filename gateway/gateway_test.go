package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const token = "gateway-token"

// fixture is the gateway in front of the real discovery server (memory
// store) over three External proxies, each a real Squid on its own
// loopback address that also leaves from it, so the local sites below see
// which upstream carried a request by its source address.
type fixture struct {
	gw      *gateway.Gateway
	server  *discovery.Server
	gwAddr  string
	api     *httptest.Server
	view    *broker.View
	squids  map[string]*squid.Squid // by proxy id
	byIP    map[string]string       // upstream source address -> proxy id
	proxies []string
	// sites are HTTPS sites on distinct loopback addresses (distinct hosts
	// for cooldowns); each records who came through which upstream.
	sites []*site
	plain *site
}

// site is a local web site that records the upstream of every request.
type site struct {
	srv *httptest.Server
	mu  sync.Mutex
	// seen: upstream proxy id of each request, in order; at: when each
	// arrived.
	seen []string
	at   []time.Time
	// headers: the last request's headers.
	headers http.Header
	// limited answers 429 to requests through this upstream; limitFirst
	// sets it to the first upstream that comes.
	limited    string
	limitFirst bool
	// forbidden answers 403 to requests through this upstream;
	// forbidFirst sets it to the first upstream that comes.
	forbidden   string
	forbidFirst bool
	// reportedAt is len(seen) when the first session report for the site
	// was taken (and the gateway had closed the tunnels it concerns); -1
	// before.
	reportedAt int
	// handshakeDelay holds each TLS handshake this long (nanoseconds), as
	// a site far away or slow to answer does.
	handshakeDelay atomic.Int64
}

func (s *site) host() string { return s.srv.Listener.Addr().(*net.TCPAddr).IP.String() }

func (s *site) upstreams() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

func newFixture(t testing.TB, opts gateway.Options) *fixture {
	return newFixtureOn(t, opts, clock.RealClock{})
}

// newFixtureOn is newFixture with discovery (its server and memory store)
// on clk.
func newFixtureOn(t testing.TB, opts gateway.Options, clk clock.WithTicker) *fixture {
	t.Helper()
	return newFixtureWith(t, opts, clk, squid.DefaultRules, nil)
}

// newFixtureWith is newFixtureOn with Squids that follow rules (acl and
// http_access lines), and discovery's options changed by tweak (nil: as
// they are).
func newFixtureWith(t testing.TB, opts gateway.Options, clk clock.WithTicker, rules string, tweak func(*discovery.Options)) *fixture {
	t.Helper()
	f := &fixture{view: broker.NewView(nil, "operator-ns"), squids: map[string]*squid.Squid{}, byIP: map[string]string{}}
	dopts := discovery.Options{
		Store: lease.NewMemoryStore(clk), View: f.view, Tokens: discovery.StaticToken(token), Clock: clk,
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: time.Minute,
	}
	if tweak != nil {
		tweak(&dopts)
	}
	server := discovery.NewServer(dopts)
	f.server = server
	f.api = httptest.NewServer(server.Handler())
	t.Cleanup(f.api.Close)
	for i, name := range []string{"a", "b", "c"} {
		ip := fmt.Sprintf("127.0.0.%d", 71+i)
		sq := squid.Start(t, squid.Config{Address: ip, Port: 3128, Rules: rules + "tcp_outgoing_address " + ip + "\n"})
		id := "crawl/" + name
		f.addProxy(t, name, ip)
		f.squids[id], f.byIP[ip] = sq, id
		f.proxies = append(f.proxies, id)
	}
	for i := range 2 {
		f.sites = append(f.sites, f.startSite(t, fmt.Sprintf("127.0.0.%d", 81+i), true))
	}
	f.plain = f.startSite(t, "127.0.0.83", false)

	opts.Upstreams = server.Tunnels()
	opts.Addr = "127.0.0.1:0"
	if opts.Destinations.ConnectPorts == nil {
		// The fixture's sites listen on any port.
		opts.Destinations.ConnectPorts, opts.Destinations.HTTPPorts = []int{0}, []int{0}
	}
	f.gw = gateway.New(opts)
	server.Broker().OnSessionReport(f.gw.OnSessionReport)
	server.Broker().OnSessionReport(func(r broker.SessionReport) {
		for _, s := range f.sites {
			s.mu.Lock()
			if s.host() == r.Target && s.reportedAt < 0 {
				s.reportedAt = len(s.seen)
			}
			s.mu.Unlock()
		}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f.gwAddr = lis.Addr().String()
	srv := &http.Server{Handler: f.gw, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

func (f *fixture) addProxy(t testing.TB, name, ip string) {
	t.Helper()
	f.view.Handler().OnAdd(externalProxy(name, ip, true), false)
}

// setHealth turns a proxy's Healthy condition, as the health engine would.
func (f *fixture) setHealth(t testing.TB, id string, healthy bool) {
	t.Helper()
	for ip, of := range f.byIP {
		if of == id {
			name := strings.TrimPrefix(id, "crawl/")
			f.view.Handler().OnUpdate(externalProxy(name, ip, !healthy), externalProxy(name, ip, healthy))
			return
		}
	}
	t.Fatalf("no proxy %s", id)
}

func externalProxy(name, ip string, healthy bool) *crawlv1alpha1.Proxy {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "local"},
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128},
	}
	status := metav1.ConditionTrue
	if !healthy {
		status = metav1.ConditionFalse
	}
	testenv.SetHealth(p, status, "ProbeSucceeded")
	return p
}

func (f *fixture) startSite(t testing.TB, ip string, https bool) *site {
	t.Helper()
	s := &site{reportedAt: -1}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from, _, _ := net.SplitHostPort(r.RemoteAddr)
		up := f.byIP[from]
		s.mu.Lock()
		s.seen = append(s.seen, up)
		s.at = append(s.at, time.Now())
		s.headers = r.Header.Clone()
		if s.limitFirst && s.limited == "" {
			s.limited = up
		}
		limited := s.limited != "" && s.limited == up
		if s.forbidFirst && s.forbidden == "" {
			s.forbidden = up
		}
		forbidden := s.forbidden != "" && s.forbidden == up
		s.mu.Unlock()
		if forbidden {
			http.Error(w, "this IP is banned here", http.StatusForbidden)
			return
		}
		if limited {
			w.Header().Set("Retry-After", "600")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		if n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/big/")); err == nil {
			// n bytes, for tests that count what a tunnel carries.
			w.Header().Set("Content-Length", strconv.Itoa(n))
			_, _ = io.CopyN(w, zeros{}, int64(n))
			return
		}
		_, _ = fmt.Fprintf(w, "page %s from %s", r.URL.Path, r.Host)
	}))
	lis, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	s.srv.Listener = lis
	if https {
		// A certificate for the site's own address, which a client that
		// verifies (the inspecting gateway) checks.
		cert, err := simweb.SelfSigned(net.ParseIP(ip), "gateway test site "+ip)
		require.NoError(t, err)
		s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				time.Sleep(time.Duration(s.handshakeDelay.Load()))
				return nil, nil
			}}
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	t.Cleanup(s.srv.Close)
	return s
}

// proxyURL is the gateway's URL for a session (and selector terms).
func (f *fixture) proxyURL(username string) *url.URL {
	return &url.URL{Scheme: "http", User: url.UserPassword(username, token), Host: f.gwAddr}
}

// client is a Go client of the gateway for username; every request gets
// its own tunnel, and upstream records each tunnel's X-Egress-Proxy.
func (f *fixture) client(username string) (*http.Client, *[]string) {
	var mu sync.Mutex
	upstreams := &[]string{}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(f.proxyURL(username)),
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local test site's certificate
		DisableKeepAlives: true,
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			mu.Lock()
			defer mu.Unlock()
			*upstreams = append(*upstreams, resp.Header.Get(gateway.HeaderUpstream))
			return nil
		},
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}, upstreams
}

func get(t *testing.T, c *http.Client, rawURL string) (int, string) {
	t.Helper()
	resp, err := c.Get(rawURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// reportSession reports a session's requests to host through the API.
func (f *fixture) reportSession(t *testing.T, session, result, host string, retryAfter int) {
	t.Helper()
	body := fmt.Sprintf(`{"result":%q,"target":%q,"retryAfterSeconds":%d}`, result, host, retryAfter)
	req, err := http.NewRequest(http.MethodPost, f.api.URL+"/v1/sessions/"+session+"/report", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s", msg)
}

func only(t *testing.T, ids []string) string {
	t.Helper()
	require.NotEmpty(t, ids)
	for _, id := range ids {
		require.Equal(t, ids[0], id, "one upstream expected, got %v", ids)
	}
	return ids[0]
}

func TestCurlAndGoFetchThroughTheGateway(t *testing.T) {
	curl, err := exec.LookPath("curl")
	require.NoError(t, err, "curl is missing: apt-get install -y curl")
	f := newFixture(t, gateway.Options{})
	target := f.sites[0].srv.URL + "/hello"

	out, err := exec.Command(curl, "-sS", "-k", "--max-time", "20", "-D", "-", "--proxy", f.proxyURL("curl-1").String(), target).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "page /hello from "+f.sites[0].srv.Listener.Addr().String())
	// curl prints the CONNECT reply's headers too: the upstream is named.
	assert.Regexp(t, `(?i)`+gateway.HeaderUpstream+`: crawl/[abc]`, string(out))

	c, ups := f.client("go-1")
	status, body := get(t, c, target)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "page /hello from "+f.sites[0].srv.Listener.Addr().String(), body)
	assert.Equal(t, f.sites[0].upstreams()[1], only(t, *ups), "the reply names the upstream the site saw")

	// Plain HTTP too; the client's token never leaves the gateway.
	status, body = get(t, c, f.plain.srv.URL+"/plain")
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, "page /plain from "+f.plain.srv.Listener.Addr().String(), body)
	f.plain.mu.Lock()
	assert.Empty(t, f.plain.headers.Get("Proxy-Authorization"), "the client's token is not forwarded")
	assert.Empty(t, f.plain.headers.Get("Proxy-Connection"))
	f.plain.mu.Unlock()
	assert.NotEmpty(t, f.plain.upstreams()[0], "through an upstream")
}

func TestASessionSticksAndAnEmptyOneRotates(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	c, ups := f.client("sticky-1.geo-local")
	for i := range 6 {
		status, _ := get(t, c, fmt.Sprintf("%s/%d", f.sites[i%2].srv.URL, i))
		require.Equal(t, http.StatusOK, status)
	}
	own := only(t, *ups)
	assert.Equal(t, own, only(t, append(f.sites[0].upstreams(), f.sites[1].upstreams()...)))

	// Another session's tunnels go to the least-loaded proxies: while one
	// tunnel of each is held open, three sessions take three upstreams.
	held := map[string]bool{}
	for i := range 3 {
		conn := f.openTunnel(t, fmt.Sprintf("holder-%d", i), f.sites[0].srv.Listener.Addr().String())
		held[conn.upstream] = true
	}
	assert.Len(t, held, 3, "least-loaded spreads open tunnels over every proxy: %v", held)

	rot, rotUps := f.client("")
	for i := range 6 {
		status, _ := get(t, rot, fmt.Sprintf("%s/r%d", f.sites[0].srv.URL, i))
		require.Equal(t, http.StatusOK, status)
	}
	distinct := map[string]bool{}
	for _, id := range *rotUps {
		distinct[id] = true
	}
	assert.Greater(t, len(distinct), 1, "no session: tunnels rotate, got %v", *rotUps)
}

func TestAKilledUpstreamMovesTheSessionWithinOneRequest(t *testing.T) {
	var mu sync.Mutex
	var unreachable []string // what the health engine was asked to probe at once
	f := newFixture(t, gateway.Options{OnUnreachable: func(id string) {
		mu.Lock()
		defer mu.Unlock()
		unreachable = append(unreachable, id)
	}})
	c, ups := f.client("mover")
	status, _ := get(t, c, f.sites[0].srv.URL+"/1")
	require.Equal(t, http.StatusOK, status)
	own := only(t, *ups)

	f.squids[own].Stop() // health has not noticed: discovery still lists it
	status, body := get(t, c, f.sites[0].srv.URL+"/2")
	require.Equal(t, http.StatusOK, status, "the very next request succeeds: %s", body)
	moved := (*ups)[1]
	assert.NotEqual(t, own, moved)
	for i := range 4 {
		status, _ = get(t, c, fmt.Sprintf("%s/after-%d", f.sites[1].srv.URL, i))
		require.Equal(t, http.StatusOK, status)
	}
	assert.Equal(t, moved, only(t, (*ups)[1:]), "and sticks to its new proxy")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{own}, unreachable, "the dead proxy, and only it, is probed at once")
}

func TestARateLimitedHostIsAvoidedForThatHostOnly(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	c, ups := f.client("limited")
	status, _ := get(t, c, f.sites[0].srv.URL+"/1")
	require.Equal(t, http.StatusOK, status)
	own := only(t, *ups)

	// Held open through own, the tunnel to site 0 is closed by the report.
	held := f.openTunnel(t, "limited", f.sites[0].srv.Listener.Addr().String())
	require.Equal(t, own, held.upstream)
	f.sites[0].mu.Lock()
	f.sites[0].limited = own
	f.sites[0].mu.Unlock()
	status, _ = get(t, c, f.sites[0].srv.URL+"/2")
	require.Equal(t, http.StatusTooManyRequests, status)
	f.reportSession(t, "limited", lease.ResultRateLimited, f.sites[0].host(), 600)
	_ = held.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := held.conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the session's open tunnel to the reported host was closed")

	*ups = nil
	for i := range 4 {
		status, _ = get(t, c, fmt.Sprintf("%s/after-%d", f.sites[0].srv.URL, i))
		require.Equal(t, http.StatusOK, status)
	}
	detour := only(t, *ups)
	assert.NotEqual(t, own, detour, "the reported host goes elsewhere")
	*ups = nil
	status, _ = get(t, c, f.sites[1].srv.URL+"/other")
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, own, only(t, *ups), "other hosts stay on the session's own proxy")
	seen := f.sites[0].upstreams()
	for _, id := range seen[2:] {
		assert.NotEqual(t, own, id, "no request to the reported host through the cooling upstream: %v", seen)
	}
}

func TestTheGatewayIsNeverOpen(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	target := f.sites[0].srv.Listener.Addr().String()
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"no credentials", "", http.StatusProxyAuthRequired},
		{"wrong token", basic("s1", "nope"), http.StatusProxyAuthRequired},
		{"bad session", basic("bad session!", token), http.StatusBadRequest},
		{"bad selector term", basic("s1.geo", token), http.StatusBadRequest},
		{"not bearer", "Bearer " + token, http.StatusProxyAuthRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := rawConnect(t, f.gwAddr, target, tc.auth)
			assert.Equal(t, tc.want, resp.StatusCode)
			if tc.want == http.StatusProxyAuthRequired {
				assert.Contains(t, resp.Header.Get("Proxy-Authenticate"), "Basic")
			}
		})
	}
	// A selector nothing matches: 503 with a Retry-After, not a hang.
	resp := rawConnect(t, f.gwAddr, target, basic("s1.geo-mars", token))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	// With no token (--discovery-auth=none, or the token Secret missing or
	// its key emptied), the gateway refuses everyone alike: 503 with a Retry-After, whether
	// or not they send credentials, and never asks for any.
	for name, tokens := range map[string]discovery.TokenSource{"auth none": discovery.StaticToken(""), "Secret missing": discovery.NewSecretToken()} {
		locked := gateway.New(gateway.Options{Upstreams: discovery.NewServer(discovery.Options{
			Store: lease.NewMemoryStore(nil), View: f.view, Tokens: tokens, Tenants: oneTeam{},
		}).Tunnels()})
		// A team's ServiceAccount token too: locked is locked for everyone.
		for _, auth := range []string{"", basic("s1", ""), basic("s1", token), basic("s1", "team-token")} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodConnect, "http://"+target, nil)
			req.Host = target
			if auth != "" {
				req.Header.Set("Proxy-Authorization", auth)
			}
			locked.ServeHTTP(rec, req)
			assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "%s, Proxy-Authorization %q", name, auth)
			assert.Equal(t, "60", rec.Header().Get("Retry-After"), "%s, Proxy-Authorization %q", name, auth)
			assert.Empty(t, rec.Header().Get("Proxy-Authenticate"), "no credentials can help")
			assert.Contains(t, rec.Body.String(), "needs the discovery token")
		}
	}
}

func TestBoundedTunnels(t *testing.T) {
	f := newFixture(t, gateway.Options{MaxTunnels: 1, SlotWait: 200 * time.Millisecond, IdleTimeout: time.Second})
	target := f.sites[0].srv.Listener.Addr().String()
	first := f.openTunnel(t, "cap", target)
	resp := rawConnect(t, f.gwAddr, target, basic("cap", token))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "beyond the cap: 503, not a queue")
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	// Idle for a second: closed, and its place is free again.
	_ = first.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, err := first.conn.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
	assert.Less(t, time.Since(start), 8*time.Second)
	require.Eventually(t, func() bool { return f.gw.Open() == 0 }, 5*time.Second, 20*time.Millisecond)
	second := f.openTunnel(t, "cap", target)
	assert.NotEmpty(t, second.upstream)
}

// openTunnel opens a CONNECT through the gateway and leaves it open.
type openTunnel struct {
	conn     net.Conn
	upstream string
}

func (f *fixture) openTunnel(t *testing.T, session, target string) openTunnel {
	t.Helper()
	conn, err := net.Dial("tcp", f.gwAddr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", target, target, basic(session, token))
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = resp.Body.Close() // a CONNECT's 200 has none; the tunnel stays open
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return openTunnel{conn: conn, upstream: resp.Header.Get(gateway.HeaderUpstream)}
}

// answer is a CONNECT's answer.
type answer struct {
	StatusCode int
	Header     http.Header
}

func rawConnect(t *testing.T, gw, target, auth string) answer {
	t.Helper()
	conn, err := net.Dial("tcp", gw)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	var b bytes.Buffer
	fmt.Fprintf(&b, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if auth != "" {
		fmt.Fprintf(&b, "Proxy-Authorization: %s\r\n", auth)
	}
	b.WriteString("\r\n")
	_, err = conn.Write(b.Bytes())
	require.NoError(t, err)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	_ = resp.Body.Close()
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}
