package discovery

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/julienschmidt/httprouter"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const (
	benchProxies = 10_000
	benchClients = 256
	benchPairs   = 20_000 // lease+release pairs per round: 40,000 requests
)

// serve runs h on a loopback port until the benchmark ends.
func serve(b *testing.B, h http.Handler) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// drive runs benchPairs iterations of pair across benchClients goroutines and
// returns the wall time and every request's latency.
func drive(b *testing.B, pair func(c *http.Client, lat *[]time.Duration) error) (time.Duration, []time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: benchClients, MaxIdleConnsPerHost: benchClients}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for g := range benchClients {
		wg.Go(func() {
			var lat []time.Duration
			for i := g; i < benchPairs; i += benchClients {
				if err := pair(client, &lat); err != nil {
					b.Error(err)
					return
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return time.Since(start), all
}

func timed(lat *[]time.Duration, c *http.Client, req *http.Request, want int) ([]byte, error) {
	t := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	*lat = append(*lat, time.Since(t))
	if res.StatusCode != want {
		return nil, fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, res.StatusCode, body)
	}
	return body, err
}

// leaseAndRelease is one pair of a lease benchmark against base with
// token: a lease of a geo=eu proxy for example.com, then its release.
func leaseAndRelease(base, token string) func(c *http.Client, lat *[]time.Duration) error {
	body := []byte(`{"selector":{"geo":"eu"},"ttlSeconds":300,"target":"example.com"}`)
	return func(c *http.Client, lat *[]time.Duration) error {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/leases", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		out, err := timed(lat, c, req, http.StatusCreated)
		if err != nil {
			return err
		}
		var lease leaseResponse
		if err := json.Unmarshal(out, &lease); err != nil {
			return err
		}
		req, _ = http.NewRequest(http.MethodDelete, base+"/v1/leases/"+lease.LeaseID, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		_, err = timed(lat, c, req, http.StatusNoContent)
		return err
	}
}

// side drives project and baseline pairs in turn, each loop of the
// benchmark, and reports each side's requests/s and latency percentiles in
// units named by its side (<who>_req/s, <who>_p99_us).
func side(b *testing.B, who, baseWho string, project, baseline func(c *http.Client, lat *[]time.Duration) error, percentiles ...float64) {
	var times [2]time.Duration
	var lats [2][]time.Duration
	for b.Loop() {
		for i, pair := range []func(c *http.Client, lat *[]time.Duration) error{project, baseline} {
			t, lat := drive(b, pair)
			times[i] += t
			lats[i] = append(lats[i], lat...)
		}
	}
	requests := float64(2 * benchPairs * b.N)
	for i, name := range []string{who, baseWho} {
		b.ReportMetric(requests/times[i].Seconds(), name+"_req/s")
		for _, p := range percentiles {
			b.ReportMetric(float64(percentile(lats[i], p).Microseconds()), fmt.Sprintf("%s_p%02.0f_us", name, p*100))
		}
	}
}

// benchView is a view of benchProxies healthy External proxies (geo=eu)
// in namespace bench; poolOf names the pool the i-th belongs to ("" none).
func benchView(poolOf func(i int) string) *broker.View {
	view := broker.NewView(nil, "operator-ns")
	for i := range benchProxies {
		p := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("px-%05d", i)},
			Spec:   crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "eu"}},
			Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.1", Port: int32(10000 + i%50000)}}
		if pool := poolOf(i); pool != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: pool,
				UID: types.UID("u-" + pool), Controller: ptrTo(true)}}
		}
		testenv.SetHealth(p, metav1.ConditionTrue, "x")
		view.Upsert(p)
	}
	return view
}

func percentile(lat []time.Duration, p float64) time.Duration {
	slices.Sort(lat)
	return lat[int(p*float64(len(lat)-1))]
}

// BenchmarkLeaseRelease10k drives the real discovery server over loopback:
// 10,000 healthy proxies, 256 concurrent clients each leasing and releasing.
// In the same run, the same clients hit a bare httprouter handler returning a
// fixed JSON body of the same shape: the ratio is what the API costs over
// the HTTP stack itself.
func BenchmarkLeaseRelease10k(b *testing.B) {
	view := benchView(func(int) string { return "" })
	api := serve(b, NewServer(Options{Store: lease.NewMemoryStore(nil), View: view, Tokens: StaticToken("bench-token"), Clock: clock.RealClock{},
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown}).Handler())

	fixed, _ := json.Marshal(leaseResponse{LeaseID: "00000000-0000-0000-0000-000000000000",
		Proxy:     broker.ProxyInfo{ID: "bench/px-00000", IP: "127.0.0.1", Port: 10000, URL: "http://127.0.0.1:10000", Attributes: map[string]string{"geo": "eu", "mode": "External"}, Healthy: true, ActiveLeases: 1},
		ExpiresAt: time.Now()})
	router := httprouter.New()
	router.POST("/v1/leases", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(fixed)
	})
	router.DELETE("/v1/leases/:id", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) { w.WriteHeader(http.StatusNoContent) })
	bare := serve(b, router)

	side(b, "api", "bare", leaseAndRelease(api, "bench-token"), leaseAndRelease(bare, "bench-token"), 0.50, 0.99)
	b.ReportMetric(0, "ns/op")
}

// benchReviews is an API server that answers every review at once: a
// team's token is its ServiceAccount's, and RBAC grants it every pool and
// stand-alone Proxy of the benchmark's namespace.
type benchReviews struct{ token string }

func (r benchReviews) Create(_ context.Context, review *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	out := review.DeepCopy()
	if review.Spec.Token == r.token {
		out.Status.Authenticated, out.Status.Audiences = true, review.Spec.Audiences
		out.Status.User = authenticationv1.UserInfo{Username: "system:serviceaccount:crawl-a:crawler", UID: "uid-a"}
	}
	return out, nil
}

type benchAccess struct{}

func (benchAccess) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	out := sar.DeepCopy()
	out.Status.Allowed = sar.Spec.ResourceAttributes != nil && sar.Spec.ResourceAttributes.Namespace == "bench"
	return out, nil
}

// BenchmarkTenantLease10k: the same lease and release as
// BenchmarkLeaseRelease10k, by a team's ServiceAccount token (tenant
// narrowing through the real tenant checker and kubeauth's caches, over an
// API server that answers at once) beside the platform token's, in the same
// run, at 10,000 proxies: 200 stand-alone Proxies and 20 pools of 490. The
// platform's lease is the baseline (bare_*): the ratio is what a tenant's
// narrowing costs.
func BenchmarkTenantLease10k(b *testing.B) {
	view := benchView(func(i int) string {
		if i < 200 {
			return ""
		}
		return fmt.Sprintf("pool-%02d", (i-200)%20)
	})
	teamToken := benchJWT(time.Now().Add(time.Hour))
	reviewer := kubeauth.NewReviewer(benchReviews{token: teamToken}, benchAccess{}, tenant.DefaultAudience, 30*time.Second)
	api := serve(b, NewServer(Options{Store: lease.NewMemoryStore(nil), View: view, Tokens: StaticToken("bench-token"), Clock: clock.RealClock{},
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown, Tenants: tenant.NewChecker(reviewer),
		TenantReviewTTL: 30 * time.Second}).Handler())

	side(b, "tenant", "bare", leaseAndRelease(api, teamToken), leaseAndRelease(api, "bench-token"), 0.99)
	b.ReportMetric(0, "ns/op")
}

// benchJWT is a token shaped like a ServiceAccount token for the
// operator's audience (the bench's API server knows it by its text).
func benchJWT(exp time.Time) string {
	enc := func(v any) string {
		raw, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(raw)
	}
	return enc(map[string]string{"alg": "RS256"}) + "." + enc(map[string]any{"aud": []string{tenant.DefaultAudience}, "exp": exp.Unix()}) + ".c2ln"
}
