package broker

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// brokerFixture is a broker over a memory store and a view, on a fake
// clock.
type brokerFixture struct {
	broker *Broker
	view   *View
	clock  *clocktesting.FakeClock
}

// proxy adds a healthy Proxy built with spec hash h1 (whose record the
// fixture's credentials hold) to the view.
func (f *brokerFixture) proxy(name, ip string) {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128,
			InstanceName: "px-crawl-" + name, SpecHash: "h1"},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "x")
	f.view.Upsert(p)
}

// leaseSchemeFixture is a broker whose proxy crawl/eu-1 was built to check
// per-lease credentials; shared is its record.
func leaseSchemeFixture(t *testing.T) (*brokerFixture, credentials.Credentials) {
	t.Helper()
	shared := credentials.Credentials{Username: "crawler", Password: "s3cret-password-0123", Scheme: credentials.SchemeLease}
	f := &brokerFixture{view: NewView(nil, "operator-ns"), clock: clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))}
	f.broker = New(Options{DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, DefaultCooldown: DefaultCooldown,
		Store: lease.NewMemoryStore(f.clock), View: f.view, Clock: f.clock,
		Credentials: testenv.Records{"operator-ns/" + credentials.RecordName("crawl", "h1"): shared}})
	f.proxy("eu-1", "127.0.0.9")
	return f, shared
}

// TestReleaseRevokesThroughTheProxy: releasing a lease on a proxy that
// takes per-lease credentials sends that proxy a CONNECT whose credentials,
// signed with its key, name the lease; the proxy's 407 is the answer.
func TestReleaseRevokesThroughTheProxy(t *testing.T) {
	f, shared := leaseSchemeFixture(t)
	seen := make(chan string, 4)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.Header.Get("Proxy-Authorization")
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	defer proxy.Close()
	f.broker.revoker.dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, proxy.Listener.Addr().String())
	}

	granted, err := f.broker.Lease(context.Background(), tenant.Platform, LeaseRequest{TTL: time.Minute})
	require.NoError(t, err)
	id := granted.ID
	require.NoError(t, f.broker.Release(context.Background(), tenant.Platform, id))
	f.broker.revoker.flush(context.Background())
	got := <-seen
	method, header, _ := strings.Cut(got, " ")
	assert.Equal(t, http.MethodConnect, method)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(header, "Basic "))
	require.NoError(t, err)
	user, pass, _ := strings.Cut(string(raw), ":")
	want, err := shared.Revocation("crawl/eu-1", []string{id}, time.Unix(mustUnix(t, user), 0))
	require.NoError(t, err)
	assert.Equal(t, want.Username, user, "revoke~<until>~<lease id>")
	assert.Equal(t, want.Password, pass, "signed with the proxy's key")
	assert.Equal(t, 1.0, testutil.ToFloat64(revocationsTotal.WithLabelValues("sent")))
}

// mustUnix is the notAfter of a revocation's username.
func mustUnix(t *testing.T, user string) int64 {
	parts := strings.Split(user, "~")
	require.Len(t, parts, 3, user)
	n, err := strconv.ParseInt(parts[1], 10, 64)
	require.NoError(t, err)
	return n
}

// TestRevocationsDoNotStallBehindDeadProxies: with 40 proxies in the queue
// that take a connection and never answer (each holds its send for the
// whole revokeTimeout), a live proxy's revocation still goes out in the
// same flush, well within one timeout per batch of revokeParallel; a
// revocation past its lease's expiry is dropped, not retried; a proxy that
// left the fleet has its revocations dropped.
func TestRevocationsDoNotStallBehindDeadProxies(t *testing.T) {
	f, shared := leaseSchemeFixture(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	seen := make(chan string, 4)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Proxy-Authorization")
		w.WriteHeader(http.StatusProxyAuthRequired)
	}))
	defer live.Close()

	now := f.clock.Now()
	for i := range 40 {
		id := fmt.Sprintf("crawl/dead-%d", i)
		f.proxy(fmt.Sprintf("dead-%d", i), fmt.Sprintf("127.0.1.%d", i))
		f.broker.revoker.add(id, silent.Addr().String(), shared, fmt.Sprintf("lease-dead-%d", i), now.Add(time.Hour))
	}
	f.broker.revoker.add("crawl/eu-1", live.Listener.Addr().String(), shared, "lease-live", now.Add(time.Hour))
	f.broker.revoker.add("crawl/eu-1", live.Listener.Addr().String(), shared, "lease-expired", now.Add(-time.Second))
	f.broker.revoker.add("crawl/gone", silent.Addr().String(), shared, "lease-gone", now.Add(time.Hour))

	start := time.Now()
	f.broker.revoker.flush(context.Background())
	took := time.Since(start)
	t.Logf("the flush took %s", took)
	select {
	case header := <-seen:
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(header, "Basic "))
		require.NoError(t, err)
		assert.Contains(t, string(raw), "lease-live")
		assert.NotContains(t, string(raw), "lease-expired", "an expired lease's credentials are refused anyway")
	default:
		t.Fatal("the live proxy was not told in the flush")
	}
	assert.Less(t, took, 3*revokeTimeout, "40 silent proxies cost about two timeouts in parallel, not 40 in a row")
	assert.Equal(t, 40, f.broker.revoker.queued(), "the silent proxies' revocations wait for the next flush; the gone proxy's and the expired one are dropped")

	f.clock.Step(2 * time.Hour)
	f.broker.revoker.flush(context.Background())
	assert.Equal(t, 0, f.broker.revoker.queued(), "once their leases expired, nothing is retried")
}
