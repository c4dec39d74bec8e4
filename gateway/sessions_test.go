package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestParseUsername(t *testing.T) {
	for _, tc := range []struct {
		username string
		want     gateway.Identity
		err      string
	}{
		{username: "", want: gateway.Identity{Selector: broker.Selector{}}},
		{username: "crawler-7.geo-eu", want: gateway.Identity{Session: "crawler-7", Selector: broker.Selector{"geo": "eu"}}},
		{username: "my-session", want: gateway.Identity{Session: "my-session", Selector: broker.Selector{}}},
		{username: "session-7-maxuse-50-geo-eu", want: gateway.Identity{Session: "session-7", MaxUses: 50, Selector: broker.Selector{"geo": "eu"}}},
		{username: "crawler-7.maxuse-3", want: gateway.Identity{Session: "crawler-7", MaxUses: 3, Selector: broker.Selector{}}},
		{username: "session-7", want: gateway.Identity{Session: "session-7", Selector: broker.Selector{}}},
		{username: "a-session-1", want: gateway.Identity{Session: "a-session-1", Selector: broker.Selector{}}},
		{username: "session-abc-sesstime-10-strict-exclusive-geo-eu", want: gateway.Identity{Session: "session-abc", Strict: true, Exclusive: true,
			Lifetime: 10 * time.Minute, Selector: broker.Selector{"geo": "eu"}}},
		{username: "brd-customer-acme-zone-res-country-US-session-r42", want: gateway.Identity{Session: "brd-customer-acme-zone-res-country-US-session-r42",
			Selector: broker.Selector{"country": "us"}}},
		{username: "customer-acme-cc-DE-sessid-x1-sesstime-1440", want: gateway.Identity{Session: "customer-acme-cc-DE-sessid-x1",
			Lifetime: 1440 * time.Minute, Selector: broker.Selector{"country": "de"}}},
		{username: "user-acme-country-fr-session-k-sessionduration-30", want: gateway.Identity{Session: "user-acme-country-fr-session-k",
			Lifetime: 30 * time.Minute, Selector: broker.Selector{"country": "fr"}}},
		{username: "hardsession-h1-lifetime-5m", want: gateway.Identity{Session: "hardsession-h1", Strict: true, Lifetime: 5 * time.Minute, Selector: broker.Selector{}}},
		{username: "session-s1-pool-eu.tier=premium", want: gateway.Identity{Session: "session-s1", Selector: broker.Selector{"pool": "eu", "tier": "premium"}}},
		{username: "session-s1-inspect-geo-eu", want: gateway.Identity{Session: "session-s1", Inspect: true, Selector: broker.Selector{"geo": "eu"}}},
		{username: "crawler-7.geo-eu.inspect", want: gateway.Identity{Session: "crawler-7", Inspect: true, Selector: broker.Selector{"geo": "eu"}}},
		{username: ".inspect", want: gateway.Identity{Inspect: true, Selector: broker.Selector{}}},
		{username: "session-s1-sesstime-0", err: "whole minutes from 1 to 1440"},
		{username: "session-s1-sesstime-1441", err: "whole minutes from 1 to 1440"},
		{username: "session-s1-sesstime-ten", err: "whole minutes"},
		{username: "session-s1-sesstime-5-sesstime-6", err: "given twice"},
		{username: "session-s1-maxuse-0", err: "maxuse \"0\" must be a whole number of tunnels from 1 to"},
		{username: "session-s1-maxuse-many", err: "must be a whole number of tunnels"},
		{username: "session-s1-maxuse-2-maxuse-3", err: "maxuse is given twice"},
		{username: "session-s1-geo", err: `key "geo" needs a value`},
		{username: "session-s1--strict", err: "empty term"},
		{username: "session-s1-session-s2", err: "names a session twice"},
		{username: "session--sesstime-10", err: `session key "session" without an id`},
		{username: "acme-session--strict", err: `session key "session" without an id`},
		{username: "sessid-", err: `session key "sessid" without an id`},
		{username: "zone-res-hardsession--exclusive.geo-eu", err: `session key "hardsession" without an id`},
		{username: "session-s1-geo-eu.geo-us", err: `"geo" is given twice`},
		{username: "session-" + strings.Repeat("x", 60), err: "1-64 letters"},
	} {
		t.Run(tc.username, func(t *testing.T) {
			got, err := gateway.ParseUsername(tc.username)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// lastSeenIP is the upstream address the site saw its last request from.
func (f *fixture) lastSeenIP(t *testing.T, s *site) string {
	t.Helper()
	seen := s.upstreams()
	require.NotEmpty(t, seen)
	for ip, id := range f.byIP {
		if id == seen[len(seen)-1] {
			return ip
		}
	}
	t.Fatalf("the site saw %q, no upstream of the fixture", seen[len(seen)-1])
	return ""
}

func TestAStrictSessionKeepsItsExitIPOrFails(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	target := f.sites[0].srv.Listener.Addr().String()
	var exit string
	for i := range 3 {
		resp := rawConnect(t, f.gwAddr, target, basic("team-session-s1-strict", token))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ip := resp.Header.Get(gateway.HeaderExitIP)
		require.NotEmpty(t, ip, "every CONNECT reply names the exit IP")
		assert.Contains(t, f.squids, resp.Header.Get(gateway.HeaderUpstream))
		assert.Equal(t, `egress-proxies-operator; next-hop="`+resp.Header.Get(gateway.HeaderUpstream)+`"`, resp.Header.Get("Proxy-Status"))
		if i == 0 {
			exit = ip
		}
		assert.Equal(t, exit, ip, "one exit IP for the session")
	}
	c, ups := f.client("team-session-s1-strict")
	status, _ := get(t, c, f.sites[1].srv.URL+"/page")
	require.Equal(t, http.StatusOK, status)
	own := only(t, *ups)
	assert.Equal(t, exit, f.lastSeenIP(t, f.sites[1]), "the site saw the exit IP the gateway named")

	// Its proxy dies: the strict session fails, says why, and does not
	// move (a soft one moves: TestAKilledUpstreamMovesTheSessionWithinOneRequest).
	before := errorsCounted(t, "destination_unavailable", gateway.CauseSessionLost)
	f.squids[own].Stop()
	resp := rawConnect(t, f.gwAddr, target, basic("team-session-s1-strict", token))
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	ps := resp.Header.Get("Proxy-Status")
	assert.Contains(t, ps, "egress-proxies-operator; error=destination_unavailable; next-hop=\""+own+"\"")
	assert.Contains(t, ps, `details="session_lost: strict session \"team-session-s1\" lost its proxy `+own)
	assert.Contains(t, ps, "proxy failed")
	assert.Equal(t, before+1, errorsCounted(t, "destination_unavailable", gateway.CauseSessionLost))

	// Its proxy unhealthy now: still lost, without trying it.
	f.setHealth(t, own, false)
	resp = rawConnect(t, f.gwAddr, target, basic("team-session-s1-strict", token))
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Proxy-Status"), "proxy unhealthy")
	// A new strict session starts elsewhere.
	resp = rawConnect(t, f.gwAddr, target, basic("team-session-s2-strict", token))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.NotEqual(t, own, resp.Header.Get(gateway.HeaderUpstream))
}

func TestSessionLifetimes(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFixtureOn(t, gateway.Options{}, clk)
	target := f.sites[0].srv.Listener.Addr().String()
	through := func(username string) gateway.Identity {
		t.Helper()
		resp := rawConnect(t, f.gwAddr, target, basic(username, token))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", username, resp.Header.Get("Proxy-Status"))
		return gateway.Identity{Session: resp.Header.Get(gateway.HeaderUpstream)}
	}
	soft := through("session-soft-sesstime-2").Session
	strict := through("session-hard-sesstime-2-strict").Session
	clk.Step(119 * time.Second)
	assert.Equal(t, soft, through("session-soft-sesstime-2").Session, "within its lifetime")
	assert.Equal(t, strict, through("session-hard-sesstime-2-strict").Session)

	clk.Step(2 * time.Second)
	moved := through("session-soft-sesstime-2").Session
	assert.NotEqual(t, soft, moved, "past its lifetime, a soft session takes a new proxy")
	clk.Step(119 * time.Second)
	assert.Equal(t, moved, through("session-soft-sesstime-2").Session, "and its lifetime runs from then")

	resp := rawConnect(t, f.gwAddr, target, basic("session-hard-sesstime-2-strict", token))
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "past its lifetime, a strict session ends")
	assert.Contains(t, resp.Header.Get("Proxy-Status"), `details="session_ended: strict session \"session-hard\" ended`)
}

func TestExclusiveSessions(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	target := f.sites[0].srv.Listener.Addr().String()
	held := map[string]string{}
	for i := range 3 {
		session := fmt.Sprintf("session-x%d-exclusive", i)
		resp := rawConnect(t, f.gwAddr, target, basic(session, token))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		up := resp.Header.Get(gateway.HeaderUpstream)
		assert.NotContains(t, held, up, "each exclusive session holds a proxy of its own")
		held[up] = session
		again := rawConnect(t, f.gwAddr, target, basic(session, token))
		require.Equal(t, http.StatusOK, again.StatusCode, "a session's own tunnels share its hold")
		assert.Equal(t, up, again.Header.Get(gateway.HeaderUpstream))
	}
	for _, username := range []string{"session-x9-exclusive", "session-shared", ""} {
		resp := rawConnect(t, f.gwAddr, target, basic(username, token))
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%q: every proxy is held", username)
		assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		assert.Contains(t, resp.Header.Get("Proxy-Status"), `error=destination_unavailable; details="exclusive: `)
	}
	status, header := f.apiLease(t, `{"selector":{},"exclusive":true}`)
	assert.Equal(t, http.StatusServiceUnavailable, status, "the lease API sees the holds too")
	assert.NotEmpty(t, header.Get("Retry-After"))
}

func TestEveryOwnAnswerCarriesProxyStatus(t *testing.T) {
	f := newFixture(t, gateway.Options{})
	target := f.sites[0].srv.Listener.Addr().String()
	for _, tc := range []struct {
		name, auth string
		status     int
		errType    string
		cause      string
	}{
		{"no credentials", "", http.StatusProxyAuthRequired, "http_request_denied", gateway.CauseAuthRequired},
		{"wrong token", basic("s1", "nope"), http.StatusProxyAuthRequired, "http_request_denied", gateway.CauseWrongPassword},
		{"bad username", basic("session-s1-sesstime-0", token), http.StatusBadRequest, "http_request_error", gateway.CauseBadUsername},
		{"no proxy matches", basic("s1.geo-mars", token), http.StatusServiceUnavailable, "destination_unavailable", gateway.CauseNoProxy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := errorsCounted(t, tc.errType, tc.cause)
			resp := rawConnect(t, f.gwAddr, target, tc.auth)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Regexp(t, `^egress-proxies-operator; error=`+tc.errType+`; details="`+tc.cause+`: `, resp.Header.Get("Proxy-Status"))
			assert.Equal(t, before+1, errorsCounted(t, tc.errType, tc.cause), "counted by cause")
		})
	}
	// The site's own answers over plain HTTP carry the exit IP and the
	// gateway's member of Proxy-Status.
	c, _ := f.client("plain-1")
	resp, err := c.Get(f.plain.srv.URL + "/x")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	up := resp.Header.Get(gateway.HeaderUpstream)
	assert.Equal(t, f.lastSeenIP(t, f.plain), resp.Header.Get(gateway.HeaderExitIP))
	assert.Equal(t, `egress-proxies-operator; next-hop="`+up+`"`, resp.Header.Get("Proxy-Status"))

	// Every upstream failing: 502 with the last one's failure.
	for _, sq := range f.squids {
		sq.Stop()
	}
	fail := rawConnect(t, f.gwAddr, target, basic("s2", token))
	assert.Equal(t, http.StatusBadGateway, fail.StatusCode)
	assert.Regexp(t, `^egress-proxies-operator; error=connection_refused; next-hop="crawl/[abc]"; details="upstream_failed: `, fail.Header.Get("Proxy-Status"))
}

// errorsCounted reads proxy_operator_gateway_errors_total{error,cause}.
func errorsCounted(t *testing.T, errType, cause string) float64 {
	t.Helper()
	return testenv.Counter(t, "proxy_operator_gateway_errors_total", map[string]string{"error": errType, "cause": cause})
}

// apiLease posts a lease request to the discovery API: its status and
// headers.
func (f *fixture) apiLease(t *testing.T, body string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.api.URL+"/v1/leases", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestSessionsRetireThemselves: a session whose requests keep being
// refused is retired, as Crawlee's SessionPool retires one past its error
// score: a soft session moves to another proxy and a strict one ends, and
// the client is told either way (X-Session-Retired on the answer it reads,
// Proxy-Status details session_retired). Refusals the gateway sees count
// (plain HTTP), and so do a client's reports of what its tunnels met; a
// usage cap (maxuse) retires a stint after that many tunnels.
func TestSessionsRetireThemselves(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFixtureOn(t, gateway.Options{SessionMaxErrorScore: broker.DefaultMaxErrorScore}, clk)
	f.plain.mu.Lock()
	f.plain.forbidFirst = true // the site bans the first proxy that comes
	f.plain.mu.Unlock()

	// A soft session on plain HTTP: three 403s reach the score; the fourth
	// request starts a new stint on another proxy, and says so.
	c, _ := f.client("crawler-7")
	type seen struct {
		StatusCode int
		Header     http.Header
	}
	var answers []seen
	for range 4 {
		resp, err := c.Get(f.plain.srv.URL + "/page")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		answers = append(answers, seen{resp.StatusCode, resp.Header})
	}
	banned := answers[0].Header.Get(gateway.HeaderUpstream)
	for i, resp := range answers[:3] {
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "request %d", i)
		assert.Equal(t, banned, resp.Header.Get(gateway.HeaderUpstream), "sticky until retired")
		assert.Empty(t, resp.Header.Get(gateway.HeaderSessionRetired))
	}
	moved := answers[3]
	assert.Equal(t, http.StatusOK, moved.StatusCode)
	assert.NotEqual(t, banned, moved.Header.Get(gateway.HeaderUpstream), "a retired stint moves to another proxy")
	assert.Equal(t, broker.RetiredErrors, moved.Header.Get(gateway.HeaderSessionRetired), "and the client is told")
	assert.Contains(t, moved.Header.Get("Proxy-Status"), `details="session_retired: the session's last stint was retired (error_score)`)
	resp, err := c.Get(f.plain.srv.URL + "/page")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, moved.Header.Get(gateway.HeaderUpstream), resp.Header.Get(gateway.HeaderUpstream), "the new stint sticks")
	assert.Empty(t, resp.Header.Get(gateway.HeaderSessionRetired), "told once")

	// A strict session on the banned proxy (the only healthy one for the
	// moment) ends instead.
	for _, id := range f.proxies {
		if id != banned {
			f.setHealth(t, id, false)
		}
	}
	strict, _ := f.client("team-session-s9-strict")
	resp, err = strict.Get(f.plain.srv.URL + "/page")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, banned, resp.Header.Get(gateway.HeaderUpstream))
	for _, id := range f.proxies {
		f.setHealth(t, id, true)
	}
	for range 2 {
		resp, err := strict.Get(f.plain.srv.URL + "/page")
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
	}
	resp, err = strict.Get(f.plain.srv.URL + "/page")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "a retired strict session ends")
	assert.Contains(t, resp.Header.Get("Proxy-Status"), `details="session_retired: strict session`)
	assert.Contains(t, resp.Header.Get("Proxy-Status"), "its requests were refused too often")

	// Over CONNECT the gateway sees nothing; the client's reports score
	// the session (each burst once: reports 10 s apart).
	target := f.sites[0].srv.Listener.Addr().String()
	first := rawConnect(t, f.gwAddr, target, basic("session-r1", token))
	require.Equal(t, http.StatusOK, first.StatusCode)
	for range 3 {
		f.reportSession(t, "session-r1", "blocked", f.sites[0].host(), 0)
		clk.Step(broker.SessionReportWindow)
	}
	next := rawConnect(t, f.gwAddr, target, basic("session-r1", token))
	require.Equal(t, http.StatusOK, next.StatusCode)
	assert.NotEqual(t, first.Header.Get(gateway.HeaderUpstream), next.Header.Get(gateway.HeaderUpstream))
	assert.Equal(t, broker.RetiredErrors, next.Header.Get(gateway.HeaderSessionRetired), "the CONNECT reply says so")

	// maxuse-2: two tunnels on a stint, the third starts a new one.
	var ups []string
	for range 3 {
		resp := rawConnect(t, f.gwAddr, f.sites[1].srv.Listener.Addr().String(), basic("session-u1-maxuse-2", token))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ups = append(ups, resp.Header.Get(gateway.HeaderUpstream))
		if len(ups) == 3 {
			assert.Equal(t, broker.RetiredUses, resp.Header.Get(gateway.HeaderSessionRetired))
		}
	}
	assert.Equal(t, ups[0], ups[1])
	assert.NotEqual(t, ups[1], ups[2], "a new proxy after two tunnels")
}
