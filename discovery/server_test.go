package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// fixture is a server over a view, store and fake clock.
type fixture struct {
	t     *testing.T
	srv   *Server
	view  *broker.View
	store *lease.MemoryStore
	clock *clocktesting.FakeClock
	token *tokenVar
}

type tokenVar struct{ value string }

func (v *tokenVar) Token() (string, bool) { return v.value, v.value != "" }

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, view: broker.NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)), token: &tokenVar{}}
	f.store = lease.NewMemoryStore(f.clock)
	f.srv = NewServer(Options{
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown,
		Store: f.store, View: f.view, Tokens: f.token, Clock: f.clock,
	})
	return f
}

// configure changes the server's options, as a start with them would (the
// store and the view are kept).
func (f *fixture) configure(change func(*Options)) {
	opts := f.srv.opts
	change(&opts)
	f.srv = NewServer(opts)
}

// proxy adds a Proxy to the view, Ready and with the given health.
func (f *fixture) proxy(name, ip string, healthy bool, attrs map[string]string) *crawlv1alpha1.Proxy {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128, Attributes: attrs,
			Placement: &crawlv1alpha1.Placement{Zone: "local-a"}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128},
	}
	status := metav1.ConditionFalse
	if healthy {
		status = metav1.ConditionTrue
	}
	testenv.SetHealth(p, status, "x")
	f.view.Upsert(p)
	return p
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (f *fixture) do(method, path, body string, headers ...string) response {
	f.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	raw, _ := io.ReadAll(rec.Body)
	r := response{status: rec.Code, header: rec.Header(), raw: string(raw)}
	if len(raw) > 0 {
		require.NoError(f.t, json.Unmarshal(raw, &r.body), "every body is JSON: %s", raw)
	}
	return r
}

func errorCode(r response) string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func errorMessage(r response) string {
	e, _ := r.body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	return msg
}

func proxyID(r response) string {
	p, _ := r.body["proxy"].(map[string]any)
	id, _ := p["id"].(string)
	return id
}

func TestListProxies(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, map[string]string{"geo": "eu"})
	f.proxy("eu-2", "127.0.0.12", false, map[string]string{"geo": "eu"})
	f.proxy("us-1", "127.0.0.13", true, map[string]string{"geo": "us"})

	r := f.do("GET", "/v1/proxies?healthy=true&geo=eu", "")
	require.Equal(t, http.StatusOK, r.status)
	list := r.body["proxies"].([]any)
	require.Len(t, list, 1)
	p := list[0].(map[string]any)
	assert.Equal(t, "crawl/eu-1", p["id"])
	assert.Equal(t, "http://127.0.0.11:3128", p["url"])
	assert.Equal(t, true, p["healthy"])
	assert.EqualValues(t, 0, p["activeLeases"])
	attrs := p["attributes"].(map[string]any)
	assert.Equal(t, "kind-local", attrs["provider"], "derived: provider")
	assert.Equal(t, "Managed", attrs["mode"], "derived: mode")
	assert.Equal(t, "local-a", attrs["zone"], "derived: zone")

	r = f.do("GET", "/v1/proxies?provider=kind-local&healthy=false", "")
	assert.Len(t, r.body["proxies"].([]any), 1, "unhealthy ones on request")
	r = f.do("GET", "/v1/proxies", "")
	assert.Len(t, r.body["proxies"].([]any), 3)

	_ = f.do("POST", "/v1/leases", `{"selector":{"geo":"us"}}`)
	r = f.do("GET", "/v1/proxies?geo=us", "")
	assert.EqualValues(t, 1, r.body["proxies"].([]any)[0].(map[string]any)["activeLeases"])

	for query, want := range map[string]string{
		"healthy=maybe": "healthy must be true or false",
		"geo=eu&geo=us": `"geo" is given 2 times`,
		"-bad-key=x":    `key "-bad-key"`,
		"geo=%zz":       "query string",
	} {
		r := f.do("GET", "/v1/proxies?"+query, "")
		assert.Equal(t, http.StatusBadRequest, r.status, query)
		assert.Equal(t, CodeInvalidRequest, errorCode(r), query)
		assert.Contains(t, errorMessage(r), want, query)
	}
}

func TestLeaseLifecycle(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, map[string]string{"geo": "eu"})
	f.proxy("eu-2", "127.0.0.12", true, map[string]string{"geo": "eu"})

	first := f.do("POST", "/v1/leases", `{"selector":{"geo":"eu"}}`)
	require.Equal(t, http.StatusCreated, first.status, first.raw)
	id := first.body["leaseID"].(string)
	assert.NotEmpty(t, id)
	assert.Equal(t, f.clock.Now().Add(broker.DefaultTTL).Format(time.RFC3339), first.body["expiresAt"], "TTL defaults to 300s")

	second := f.do("POST", "/v1/leases", `{"selector":{"geo":"eu"},"ttlSeconds":60}`)
	require.Equal(t, http.StatusCreated, second.status)
	assert.NotEqual(t, proxyID(first), proxyID(second), "the least-loaded proxy is leased")
	assert.Equal(t, f.clock.Now().Add(time.Minute).Format(time.RFC3339), second.body["expiresAt"])

	capped := f.do("POST", "/v1/leases", `{"ttlSeconds":999999}`)
	require.Equal(t, http.StatusCreated, capped.status)
	assert.Equal(t, f.clock.Now().Add(broker.DefaultMaxTTL).Format(time.RFC3339), capped.body["expiresAt"], "TTL is capped")

	got := f.do("GET", "/v1/leases/"+id, "")
	assert.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, proxyID(first), proxyID(got))

	f.clock.Step(200 * time.Second)
	renewed := f.do("POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds":600}`)
	require.Equal(t, http.StatusOK, renewed.status, renewed.raw)
	assert.Equal(t, f.clock.Now().Add(10*time.Minute).Format(time.RFC3339), renewed.body["expiresAt"])
	emptyRenew := f.do("POST", "/v1/leases/"+id+"/renew", "")
	assert.Equal(t, http.StatusOK, emptyRenew.status, "the renew body is optional")

	f.clock.Step(301 * time.Second)
	assert.Equal(t, http.StatusNotFound, f.do("POST", "/v1/leases/"+id+"/renew", "").status, "a lease cannot be renewed once expired")
	assert.Equal(t, http.StatusNotFound, f.do("GET", "/v1/leases/"+id, "").status)
	assert.Equal(t, CodeLeaseNotFound, errorCode(f.do("GET", "/v1/leases/"+id, "")))

	other := second.body["leaseID"].(string)
	for range 2 {
		r := f.do("DELETE", "/v1/leases/"+other, "")
		assert.Equal(t, http.StatusNoContent, r.status, "release is idempotent")
		assert.Empty(t, r.raw)
	}
	assert.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/never-existed", "").status)

	curlDefault := f.do("POST", "/v1/leases", `{}`, "Content-Type", "application/x-www-form-urlencoded")
	assert.Equal(t, http.StatusCreated, curlDefault.status, "plain curl -d works: the body is what must be JSON")
}

// TestEqualLoadsRotate: with every proxy equally loaded, leases go to the
// one leased least recently, for any selector, the empty one included (it
// once had no index in the store, and ties always went to the first id).
func TestEqualLoadsRotate(t *testing.T) {
	for _, selector := range []string{`{}`, `{"geo":"eu"}`} {
		t.Run(selector, func(t *testing.T) {
			f := newFixture(t)
			for i := range 3 {
				f.proxy(fmt.Sprintf("eu-%d", i), fmt.Sprintf("127.0.0.%d", 11+i), true, map[string]string{"geo": "eu"})
			}
			var got []string
			for range 6 {
				r := f.do("POST", "/v1/leases", `{"selector":`+selector+`}`)
				require.Equal(t, http.StatusCreated, r.status, r.raw)
				got = append(got, proxyID(r))
				require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+r.body["leaseID"].(string), "").status)
				f.clock.Step(time.Second)
			}
			assert.Equal(t, got[:3], got[3:], "a round robin: %v", got)
			assert.ElementsMatch(t, []string{"crawl/eu-0", "crawl/eu-1", "crawl/eu-2"}, got[:3], "every proxy in turn: %v", got)
		})
	}
}

func TestRateLimitCooldown(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	f.proxy("eu-2", "127.0.0.12", true, nil)

	granted := f.do("POST", "/v1/leases", `{"target":"example.com"}`)
	require.Equal(t, http.StatusCreated, granted.status)
	limited := proxyID(granted)
	id := granted.body["leaseID"].(string)
	r := f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"example.com"}`)
	require.Equal(t, http.StatusNoContent, r.status, r.raw)
	f.do("DELETE", "/v1/leases/"+id, "")

	// For example.com, only the other proxy; then none, with Retry-After.
	for range 3 {
		l := f.do("POST", "/v1/leases", `{"target":"example.com"}`)
		require.Equal(t, http.StatusCreated, l.status)
		assert.NotEqual(t, limited, proxyID(l), "a proxy cooling down for a target is not leased for it")
	}
	// Another target may get it.
	seen := map[string]bool{}
	for range 4 {
		seen[proxyID(f.do("POST", "/v1/leases", `{"target":"example.org"}`))] = true
	}
	assert.True(t, seen[limited], "the cooldown is per target")

	// With the other proxy gone unhealthy, example.com has nothing left.
	f.proxy("eu-2", "127.0.0.12", false, nil)
	none := f.do("POST", "/v1/leases", `{"target":"example.com"}`)
	assert.Equal(t, http.StatusServiceUnavailable, none.status)
	assert.Equal(t, CodeNoProxyAvailable, errorCode(none))
	assert.Equal(t, "900", none.header.Get("Retry-After"), "Retry-After: when the cooldown ends")

	f.clock.Step(broker.DefaultCooldown)
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{"target":"example.com"}`).status, "the cooldown ends")

	// A longer retryAfterSeconds wins over the default.
	id = f.do("POST", "/v1/leases", `{}`).body["leaseID"].(string)
	require.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"slow.example","retryAfterSeconds":3600}`).status)
	f.clock.Step(20 * time.Minute)
	r = f.do("POST", "/v1/leases", `{"target":"slow.example"}`)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "still cooling after 20m: the client asked for an hour")
	assert.Equal(t, "2400", r.header.Get("Retry-After"))

	// ok and error reports are counted, and change nothing.
	before := testutil.ToFloat64(reportsTotal.WithLabelValues(lease.ResultOK))
	id = f.do("POST", "/v1/leases", `{}`).body["leaseID"].(string)
	assert.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+id+"/report", `{"result":"ok","target":"example.net"}`).status)
	assert.Equal(t, before+1, testutil.ToFloat64(reportsTotal.WithLabelValues(lease.ResultOK)))
}

func TestUnhealthyAndDeletedProxies(t *testing.T) {
	f := newFixture(t)
	p := f.proxy("eu-1", "127.0.0.11", true, nil)
	granted := f.do("POST", "/v1/leases", `{}`)
	require.Equal(t, http.StatusCreated, granted.status)
	id := granted.body["leaseID"].(string)

	f.proxy("eu-1", "127.0.0.11", false, nil)
	assert.Equal(t, http.StatusServiceUnavailable, f.do("POST", "/v1/leases", `{}`).status, "an unhealthy proxy is never leased")
	got := f.do("GET", "/v1/leases/"+id, "")
	require.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, false, got.body["proxy"].(map[string]any)["healthy"], "its leases stay readable, healthy:false")

	f.view.Remove(p.Namespace + "/" + p.Name)
	got = f.do("GET", "/v1/leases/"+id, "")
	require.Equal(t, http.StatusOK, got.status)
	assert.Equal(t, "crawl/eu-1", proxyID(got))
	assert.Equal(t, false, got.body["proxy"].(map[string]any)["healthy"])
	assert.Equal(t, http.StatusServiceUnavailable, f.do("POST", "/v1/leases", `{}`).status, "a deleted proxy is never leased")
}

func TestRequestErrors(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	id := f.do("POST", "/v1/leases", `{}`).body["leaseID"].(string)
	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, message            string
	}{
		{"malformed JSON", "POST", "/v1/leases", `{"selector":`, nil, 400, CodeInvalidJSON, "not valid JSON"},
		{"trailing data", "POST", "/v1/leases", `{} {}`, nil, 400, CodeInvalidJSON, "data after the JSON object"},
		{"unknown field", "POST", "/v1/leases", `{"ttl":30}`, nil, 400, CodeInvalidRequest, `unknown field "ttl"`},
		{"wrong type", "POST", "/v1/leases", `{"ttlSeconds":"5m"}`, nil, 400, CodeInvalidRequest, "field ttlSeconds must be a int64"},
		{"zero TTL", "POST", "/v1/leases", `{"ttlSeconds":0}`, nil, 400, CodeInvalidRequest, "ttlSeconds must be at least 1"},
		{"bad selector key", "POST", "/v1/leases", `{"selector":{"a b":"x"}}`, nil, 400, CodeInvalidRequest, `selector key "a b"`},
		{"bad target", "POST", "/v1/leases", `{"target":"http://example.com/"}`, nil, 400, CodeInvalidRequest, "target must be a host name"},
		{"body too large", "POST", "/v1/leases", `{"target":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, nil, 413, CodeBodyTooLarge, "larger than"},
		{"not JSON, whatever the header", "POST", "/v1/leases", `x`, []string{"Content-Type", "text/plain"}, 400, CodeInvalidJSON, "not valid JSON"},
		{"report: unknown result", "POST", "/v1/leases/" + id + "/report", `{"result":"banned"}`, nil, 400, CodeInvalidRequest, "result must be one of"},
		{"report: rate_limited without target", "POST", "/v1/leases/" + id + "/report", `{"result":"rate_limited"}`, nil, 400, CodeInvalidRequest, "target is required"},
		{"report: negative retryAfter", "POST", "/v1/leases/" + id + "/report", `{"result":"rate_limited","target":"a.com","retryAfterSeconds":-1}`, nil, 400, CodeInvalidRequest, "retryAfterSeconds must be between 0 and 86400"},
		{"report: unknown lease", "POST", "/v1/leases/nope/report", `{"result":"ok"}`, nil, 404, CodeLeaseNotFound, `lease "nope" does not exist`},
		{"renew: unknown lease", "POST", "/v1/leases/nope/renew", ``, nil, 404, CodeLeaseNotFound, "does not exist"},
		{"unknown route", "GET", "/v2/proxies", ``, nil, 404, CodeNotFound, "no route"},
		{"wrong method", "PUT", "/v1/leases", `{}`, nil, 405, CodeMethodNotAllowed, "PUT is not allowed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := f.do(tc.method, tc.path, tc.body, tc.headers...)
			assert.Equal(t, tc.status, r.status, r.raw)
			assert.Equal(t, tc.code, errorCode(r))
			assert.Contains(t, errorMessage(r), tc.message)
		})
	}
	r := f.do("PUT", "/v1/leases", `{}`)
	assert.Contains(t, r.header.Get("Allow"), "POST", "405 says what is allowed")
}

func TestAuth(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	f.token.value = "s3cret"

	r := f.do("GET", "/v1/proxies", "")
	assert.Equal(t, http.StatusUnauthorized, r.status)
	assert.Equal(t, CodeUnauthorized, errorCode(r))
	assert.Equal(t, `Bearer realm="egress-proxies-operator"`, r.header.Get("WWW-Authenticate"))
	assert.Equal(t, http.StatusUnauthorized, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer wrong").status)
	assert.Equal(t, http.StatusUnauthorized, f.do("GET", "/v1/proxies", "", "Authorization", "s3cret").status, "the Bearer scheme is required")
	assert.Equal(t, http.StatusUnauthorized, f.do("DELETE", "/v1/leases/x", "").status, "every API route is protected")
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer s3cret").status)
	assert.Equal(t, http.StatusOK, f.do("GET", "/healthz", "").status, "probes need no token")
	assert.Equal(t, http.StatusOK, f.do("GET", "/readyz", "").status)
	assert.Equal(t, 1.0, testutil.ToFloat64(authEnabled))

	f.token.value = "rotated" // the Secret changed
	assert.Equal(t, http.StatusUnauthorized, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer s3cret").status)
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer rotated").status)

	f.token.value = "" // the Secret is gone: unauthenticated, loudly
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "").status)
	assert.Equal(t, 0.0, testutil.ToFloat64(authEnabled))
}

func TestReadyz(t *testing.T) {
	synced := false
	store := &downStore{Store: lease.NewMemoryStore(nil)}
	srv := NewServer(Options{Store: store, View: broker.NewView(nil, "operator-ns"), Tokens: StaticToken(""), Ready: func() bool { return synced },
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown})
	readyz := func() (int, string) {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		var body errorBody
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		assert.NotContains(t, body.Error.Message, "127.0.0.1", "unauthenticated: the store's address stays in the log")
		return rec.Code, body.Error.Code
	}
	code, why := readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, CodeNotReady, why, "the view has not synced")
	synced = true
	code, _ = readyz()
	assert.Equal(t, http.StatusOK, code)
	assert.NoError(t, srv.ReadyCheck(httptest.NewRequest("GET", "/readyz", nil)), "the manager's readiness check agrees")
	store.down.Store(true)
	code, why = readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, CodeStoreUnavailable, why, "the store does not answer")
	assert.Error(t, srv.ReadyCheck(httptest.NewRequest("GET", "/readyz", nil)))
}

// downStore is a Store that stops answering when down is set, as a Redis
// that went away does.
type downStore struct {
	lease.Store
	down atomic.Bool
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func (d *downStore) check() error {
	if d.down.Load() {
		return errDown
	}
	return nil
}

func (d *downStore) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	if err := d.check(); err != nil {
		return lease.Lease{}, err
	}
	return d.Store.Acquire(ctx, req)
}

func (d *downStore) Get(ctx context.Context, id string) (lease.Lease, error) {
	if err := d.check(); err != nil {
		return lease.Lease{}, err
	}
	return d.Store.Get(ctx, id)
}

func (d *downStore) Release(ctx context.Context, id string) error {
	if err := d.check(); err != nil {
		return err
	}
	return d.Store.Release(ctx, id)
}

func (d *downStore) ActiveLeases(ctx context.Context, ids []string) ([]int, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return d.Store.ActiveLeases(ctx, ids)
}

func (d *downStore) Ping(ctx context.Context) error {
	if err := d.check(); err != nil {
		return err
	}
	return d.Store.Ping(ctx)
}

// TestStoreUnavailable: while the store does not answer, every route that
// needs it answers 503 store_unavailable with a Retry-After, never a 404 or
// a "no proxy available" that would mislead a crawler, and the errors are
// counted; once it answers again, so does the API.
func TestStoreUnavailable(t *testing.T) {
	f := newFixture(t)
	store := &downStore{Store: f.store}
	f.srv = NewServer(Options{DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown,
		Store: store, View: f.view, Tokens: f.token, Clock: f.clock})
	f.proxy("eu-1", "127.0.0.11", true, nil)
	r := f.do("POST", "/v1/leases", `{}`)
	require.Equal(t, http.StatusCreated, r.status)
	id := r.body["leaseID"].(string)

	store.down.Store(true)
	before := testenv.Counter(t, "proxy_operator_discovery_store_errors_total", map[string]string{"op": "acquire"})
	for _, req := range [][2]string{{"POST", "/v1/leases"}, {"GET", "/v1/leases/" + id}, {"DELETE", "/v1/leases/" + id}, {"GET", "/v1/proxies"}} {
		body := ""
		if req[0] == "POST" {
			body = `{}`
		}
		r := f.do(req[0], req[1], body)
		assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s %s", req[0], req[1])
		assert.Equal(t, CodeStoreUnavailable, errorCode(r), "%s %s", req[0], req[1])
		assert.Equal(t, "2", r.header.Get("Retry-After"), "%s %s", req[0], req[1])
		assert.NotContains(t, r.raw, "6379", "the store's address stays in the operator's log")
		assert.NotContains(t, r.raw, "connection refused")
	}
	assert.Equal(t, before+1, testenv.Counter(t, "proxy_operator_discovery_store_errors_total", map[string]string{"op": "acquire"}))

	store.down.Store(false)
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/leases/"+id, "").status, "the lease survived the outage")
	assert.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+id, "").status)
}

// TestStoreTimeout: a store that hangs is cut off at the store timeout.
func TestStoreTimeout(t *testing.T) {
	f := newFixture(t)
	f.srv = NewServer(Options{DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown,
		Store: hangingStore{f.store}, StoreTimeout: 50 * time.Millisecond, View: f.view, Tokens: f.token, Clock: f.clock})
	f.proxy("eu-1", "127.0.0.11", true, nil)
	start := time.Now()
	r := f.do("POST", "/v1/leases", `{}`)
	assert.Less(t, time.Since(start), time.Second)
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Equal(t, CodeStoreUnavailable, errorCode(r))
	assert.Contains(t, errorMessage(r), "did not answer in time")
}

// hangingStore's Acquire waits until its context ends, as a call to a
// Redis that stopped answering does.
type hangingStore struct{ lease.Store }

func (h hangingStore) Acquire(ctx context.Context, _ lease.AcquireRequest) (lease.Lease, error) {
	<-ctx.Done()
	return lease.Lease{}, ctx.Err()
}

func TestMetricsLint(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	f.do("POST", "/v1/leases", `{}`)
	for _, c := range append(metrics, f.store.Collectors()...) {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems)
	}
	assert.Positive(t, testutil.ToFloat64(requestsTotal.WithLabelValues("/v1/leases", "201")), "requests are counted by route pattern, not raw path")
}

// flippableHealth is a HealthSource whose verdicts a test flips.
type flippableHealth struct {
	healthy map[string]bool
	gen     uint64
}

func (h *flippableHealth) Healthy(key types.NamespacedName, _ string) (bool, bool) {
	v, ok := h.healthy[key.String()]
	return v, ok
}
func (h *flippableHealth) Generation() uint64 { return h.gen }

// TestCandidateCacheFollowsVerdicts: the per-selector candidate cache must
// never hand out a proxy the health engine just judged unhealthy, even
// before its status write arrives through the informer.
func TestCandidateCacheFollowsVerdicts(t *testing.T) {
	f := newFixture(t)
	h := &flippableHealth{healthy: map[string]bool{"crawl/eu-1": true}}
	f.view = broker.NewView(h, "operator-ns")
	f.configure(func(o *Options) { o.View = f.view })
	f.proxy("eu-1", "127.0.0.11", true, nil)

	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{}`).status)
	h.healthy["crawl/eu-1"], h.gen = false, h.gen+1 // the engine's verdict flips; status not yet written
	assert.Equal(t, http.StatusServiceUnavailable, f.do("POST", "/v1/leases", `{}`).status, "a stale cache handed out an unhealthy proxy")
	h.healthy["crawl/eu-1"], h.gen = true, h.gen+1
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{}`).status)
}

// TestRefusalsAreRecordedForRealPools: a refused lease is remembered for
// the autoscaler of each pool (namespace/name) with a member the selector
// matches; a pool name a client made up, or one in another namespace,
// leaves nothing in the store.
func TestRefusalsAreRecordedForRealPools(t *testing.T) {
	f := newFixture(t)
	member := f.proxy("eu-0", "127.0.0.11", false, nil) // unhealthy: the pool cannot serve
	member.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "eu", UID: "u", Controller: ptrTo(true)}}
	f.view.Upsert(member)

	for _, pool := range []string{"eu", "made-up-1", "made-up-2"} {
		r := f.do("POST", "/v1/leases", `{"selector":{"pool":"`+pool+`"}}`)
		require.Equal(t, http.StatusServiceUnavailable, r.status, pool)
	}
	demand, err := f.srv.Broker().PoolDemand(context.Background(), "crawl", "eu")
	require.NoError(t, err)
	assert.Equal(t, f.clock.Now(), demand.LastRefused, "the pool's autoscaler sees the refusal")
	other, err := f.srv.Broker().PoolDemand(context.Background(), "elsewhere", "eu")
	require.NoError(t, err)
	assert.True(t, other.LastRefused.IsZero(), "a pool of the same name in another namespace saw none")
	assert.Equal(t, 1, f.store.RefusedPools(), "made-up pool names are not remembered")
}

func ptrTo[T any](v T) *T { return &v }

// TestOutcomesThroughTheAPI: a blocked report cools the proxy for its
// target and goes into its record, GET /v1/proxies/<ns>/<name> shows the
// record, and the next lease for that host goes to the other proxy,
// saying why; a lease for another host is least-loaded alone.
func TestOutcomesThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	f.proxy("eu-2", "127.0.0.12", true, nil)
	l := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, l.status, l.raw)
	blockedOn := proxyID(l)
	assert.Equal(t, lease.WhyLeastLoaded, l.body["why"])
	r := f.do("POST", "/v1/leases/"+l.body["leaseID"].(string)+"/report", `{"result":"blocked","target":"shop.example"}`)
	require.Equal(t, http.StatusNoContent, r.status, r.raw)
	r = f.do("POST", "/v1/leases/"+l.body["leaseID"].(string)+"/report", `{"result":"blocked"}`)
	assert.Equal(t, http.StatusBadRequest, r.status, "blocked needs its target")
	assert.Contains(t, errorMessage(r), "target is required")

	got := f.do("GET", "/v1/proxies/"+blockedOn, "")
	require.Equal(t, http.StatusOK, got.status, got.raw)
	assert.Equal(t, blockedOn, got.body["id"])
	outcomes := got.body["outcomes"].([]any)
	require.Len(t, outcomes, 1)
	rec := outcomes[0].(map[string]any)
	assert.Equal(t, "shop.example", rec["host"])
	assert.EqualValues(t, 1, rec["blocked"])
	assert.Equal(t, lease.OutcomeReport, rec["lastBlockedBy"])
	assert.Equal(t, http.StatusNotFound, f.do("GET", "/v1/proxies/crawl/nope", "").status)

	// The blocked proxy's cooldown ends; it is still the worse choice for
	// shop.example while its record says so, though it was leased least
	// recently.
	f.clock.Step(broker.DefaultCooldown + time.Second)
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+l.body["leaseID"].(string), "").status)
	other := f.do("POST", "/v1/leases", `{"target":"news.example"}`)
	require.Equal(t, http.StatusCreated, other.status, other.raw)
	assert.Equal(t, lease.WhyLeastLoaded, other.body["why"], "another host: least-loaded alone")
	require.NotEqual(t, blockedOn, proxyID(other), "the least recently leased")
	f.clock.Step(time.Second)
	f.do("DELETE", "/v1/leases/"+other.body["leaseID"].(string), "")
	next := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, next.status, next.raw)
	assert.NotEqual(t, blockedOn, proxyID(next), "the better record wins over the least recently leased")
	assert.Equal(t, lease.WhyBetterRecord, next.body["why"])
}

// TestExitIP: a proxy's exitIP is its IP, or the egress IP the health
// engine learnt when another; leases show it.
func TestExitIP(t *testing.T) {
	f := newFixture(t)
	f.proxy("direct", "127.0.0.11", true, map[string]string{"pick": "direct"})
	natted := f.proxy("natted", "127.0.0.12", true, map[string]string{"pick": "natted"})
	natted.Status.EgressIP = "127.0.0.99"
	f.view.Upsert(natted)
	for pick, want := range map[string]string{"direct": "127.0.0.11", "natted": "127.0.0.99"} {
		l := f.do("POST", "/v1/leases", fmt.Sprintf(`{"selector":{"pick":%q}}`, pick))
		require.Equal(t, http.StatusCreated, l.status, l.raw)
		assert.Equal(t, want, l.body["proxy"].(map[string]any)["exitIP"], pick)
	}
}

// TestMovedProxyStartsClean: a proxy replaced (back on a new address)
// loses the cooldowns and record of its old one; a status update that
// keeps its address keeps them, and so does the gap while it has none.
func TestMovedProxyStartsClean(t *testing.T) {
	f := newFixture(t)
	p := f.proxy("eu-1", "127.0.0.11", true, nil)
	l := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, l.status, l.raw)
	require.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+l.body["leaseID"].(string)+"/report", `{"result":"blocked","target":"shop.example"}`).status)
	cooling := func() bool {
		r := f.do("POST", "/v1/leases", `{"target":"shop.example"}`)
		if r.status == http.StatusCreated {
			f.do("DELETE", "/v1/leases/"+r.body["leaseID"].(string), "")
		}
		return r.status == http.StatusServiceUnavailable
	}
	require.True(t, cooling())

	p.Status.Message = "unrelated"
	f.view.Upsert(p.DeepCopy())
	replacing := p.DeepCopy()
	replacing.Status.Phase, replacing.Status.IP, replacing.Status.Port = crawlv1alpha1.PhaseReplacing, "", 0
	f.view.Upsert(replacing)
	f.view.Upsert(p.DeepCopy()) // back on the same address
	require.True(t, cooling(), "same address, after a gap without one: the cooldown holds")

	moved := p.DeepCopy()
	moved.Status.IP = "127.0.0.12"
	testenv.SetHealth(moved, metav1.ConditionTrue, "x") // a verdict about the new address
	f.view.Upsert(moved)
	require.Eventually(t, func() bool { return !cooling() }, 5*time.Second, 10*time.Millisecond, "the new address starts clean")
	outcomes, err := f.store.Outcomes(context.Background(), "crawl/eu-1")
	require.NoError(t, err)
	assert.Empty(t, outcomes)
}
