package discovery

import (
	"bytes"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
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
	view := NewView(nil, "operator-ns")
	for i := range benchProxies {
		p := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("px-%05d", i)},
			Spec:   crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{"geo": "eu"}},
			Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.1", Port: int32(10000 + i%50000)}}
		testenv.SetHealth(p, metav1.ConditionTrue, "x")
		view.upsert(p)
	}
	api := serve(b, NewServer(Options{Store: NewMemoryStore(nil), View: view, Tokens: StaticToken("bench-token"), Clock: clock.RealClock{},
		DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, DefaultCooldown: DefaultCooldown}).Handler())

	fixed, _ := json.Marshal(leaseResponse{LeaseID: "00000000-0000-0000-0000-000000000000",
		Proxy:     ProxyInfo{ID: "bench/px-00000", IP: "127.0.0.1", Port: 10000, URL: "http://127.0.0.1:10000", Attributes: map[string]string{"geo": "eu", "mode": "External"}, Healthy: true, ActiveLeases: 1},
		ExpiresAt: time.Now()})
	router := httprouter.New()
	router.POST("/v1/leases", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(fixed)
	})
	router.DELETE("/v1/leases/:id", func(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) { w.WriteHeader(http.StatusNoContent) })
	bare := serve(b, router)

	body := []byte(`{"selector":{"geo":"eu"},"ttlSeconds":300,"target":"example.com"}`)
	pairOn := func(base string) func(c *http.Client, lat *[]time.Duration) error {
		return func(c *http.Client, lat *[]time.Duration) error {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/leases", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench-token")
			out, err := timed(lat, c, req, http.StatusCreated)
			if err != nil {
				return err
			}
			var lease leaseResponse
			if err := json.Unmarshal(out, &lease); err != nil {
				return err
			}
			req, _ = http.NewRequest(http.MethodDelete, base+"/v1/leases/"+lease.LeaseID, nil)
			req.Header.Set("Authorization", "Bearer bench-token")
			_, err = timed(lat, c, req, http.StatusNoContent)
			return err
		}
	}

	var apiTime, bareTime time.Duration
	var apiLat, bareLat []time.Duration
	for b.Loop() {
		t, lat := drive(b, pairOn(api))
		apiTime += t
		apiLat = append(apiLat, lat...)
		t, lat = drive(b, pairOn(bare))
		bareTime += t
		bareLat = append(bareLat, lat...)
	}
	requests := float64(2 * benchPairs * b.N)
	apiRate, bareRate := requests/apiTime.Seconds(), requests/bareTime.Seconds()
	b.ReportMetric(apiRate, "api_req/s")
	b.ReportMetric(bareRate, "bare_req/s")
	b.ReportMetric(float64(percentile(apiLat, 0.50).Microseconds()), "api_p50_us")
	b.ReportMetric(float64(percentile(apiLat, 0.99).Microseconds()), "api_p99_us")
	b.ReportMetric(float64(percentile(bareLat, 0.50).Microseconds()), "bare_p50_us")
	b.ReportMetric(float64(percentile(bareLat, 0.99).Microseconds()), "bare_p99_us")
	b.ReportMetric(0, "ns/op")
}
