package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
// arguments. The ratio is what the store's scripts cost over Redis itself;
// redis_script_us/pair is Redis's own time in them.
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
	// The bare pair sends what the store sends: an acquire's arguments
	// with SampleSize sampled candidates, then a lease id.
	sampleArgs := make([]any, 0, 14+3*redisstore.SampleSize)
	sampleArgs = append(sampleArgs, "bench:", 0, 300000, "example.com", "00000000-0000-0000-0000-000000000000", "0", 0, 0, "", "", 0, "0", "", "1")
	for _, id := range ids[:redisstore.SampleSize] {
		sampleArgs = append(sampleArgs, id, 0, "")
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

	// Every client's connection is dialed before either is timed.
	drive(b, barePair)
	var storeTime, bareTime, storeScripts time.Duration
	var storeLat, bareLat []time.Duration
	for b.Loop() {
		before := scriptTime(b, client)
		t, lat := drive(b, storePair)
		storeScripts += scriptTime(b, client) - before
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
	// Redis's own time in the store's two scripts, per pair: the figure
	// the scripts' calls decide, whatever else the machine is doing.
	b.ReportMetric(float64(storeScripts.Microseconds())/pairs, "redis_script_us/pair")
	b.ReportMetric(0, "ns/op")
}

// scriptTime is the time Redis has spent running scripts (EVALSHA) since
// it started, from INFO commandstats.
func scriptTime(b *testing.B, client *redis.Client) time.Duration {
	info := client.InfoMap(context.Background(), "commandstats")
	if err := info.Err(); err != nil {
		b.Fatal(err)
	}
	for field := range strings.SplitSeq(info.Item("Commandstats", "cmdstat_evalsha"), ",") {
		if usec, ok := strings.CutPrefix(field, "usec="); ok {
			n, err := strconv.ParseInt(usec, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
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
