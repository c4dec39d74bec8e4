package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/redisstore"
	"github.com/example/egress-proxies-operator/test/redisserver"
)

const (
	benchProxies = 10_000
	benchClients = 256
	benchPairs   = 20_000
)

// echoScript is the bare round trip: a script that does nothing with the
// same arguments an acquire sends.
var echoScript = redis.NewScript(`return 1`)

// BenchmarkRedisLeaseRelease10k: 256 clients acquire and release leases
// over 10,000 candidates on a real redis-server, each pair two round trips
// (the acquire and release scripts); then the same clients make the same
// two round trips with a script that does nothing, carrying the same
// arguments. The ratio is what the store's scripts cost over Redis itself.
func BenchmarkRedisLeaseRelease10k(b *testing.B) {
	srv := redisserver.Start(b, "")
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: benchClients})
	b.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "bench:"})
	ids := make([]string, benchProxies)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench/px-%05d", i)
	}
	candidates := lease.Candidates{Key: "geo=eu", Version: 1, IDs: ids}
	ctx := context.Background()
	// The bare pair sends what the store sends: 64 sampled ids, then one id.
	sampleArgs := make([]any, 0, redisstore.SampleSize+5)
	sampleArgs = append(sampleArgs, "bench:", 0, 300000, "example.com", "00000000-0000-0000-0000-000000000000")
	for _, id := range ids[:redisstore.SampleSize] {
		sampleArgs = append(sampleArgs, id)
	}
	if err := echoScript.Load(ctx, client).Err(); err != nil {
		b.Fatal(err)
	}

	storePair := func() error {
		l, err := store.Acquire(ctx, lease.AcquireRequest{Candidates: candidates, Target: "example.com", TTL: 5 * time.Minute})
		if err != nil {
			return err
		}
		return store.Release(ctx, l.ID)
	}
	barePair := func() error {
		if err := echoScript.EvalSha(ctx, client, nil, sampleArgs...).Err(); err != nil {
			return err
		}
		return echoScript.EvalSha(ctx, client, nil, "bench:", 0, "00000000-0000-0000-0000-000000000000").Err()
	}

	var storeTime, bareTime time.Duration
	var storeLat, bareLat []time.Duration
	for b.Loop() {
		t, lat := drive(b, storePair)
		storeTime += t
		storeLat = append(storeLat, lat...)
		t, lat = drive(b, barePair)
		bareTime += t
		bareLat = append(bareLat, lat...)
	}
	pairs := float64(benchPairs * b.N)
	b.ReportMetric(pairs/storeTime.Seconds(), "redis_pairs/s")
	b.ReportMetric(pairs/bareTime.Seconds(), "bare_pairs/s")
	b.ReportMetric(float64(percentile(storeLat, 0.99).Microseconds()), "redis_p99_us")
	b.ReportMetric(float64(percentile(bareLat, 0.99).Microseconds()), "bare_p99_us")
	b.ReportMetric(0, "ns/op")
}

// drive runs benchPairs pairs across benchClients goroutines and returns
// the wall time and each pair's latency.
func drive(b *testing.B, pair func() error) (time.Duration, []time.Duration) {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for g := range benchClients {
		wg.Go(func() {
			var lat []time.Duration
			for i := g; i < benchPairs; i += benchClients {
				t := time.Now()
				if err := pair(); err != nil {
					b.Error(err)
					return
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return time.Since(start), all
}

func percentile(lat []time.Duration, p float64) time.Duration {
	slices.Sort(lat)
	return lat[int(p*float64(len(lat)-1))]
}
