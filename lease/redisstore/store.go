// Package redisstore is the lease store (lease.Store) on Redis, shared by
// every replica that serves discovery and the gateway, so leases and
// cooldowns outlive any one process. Each operation is one Lua script, atomic and on the Redis
// server's clock; leases and cooldowns are keys that expire by themselves.
//
// Least-loaded is exact up to SampleSize candidates and sampled beyond: the
// store then looks at SampleSize candidates drawn at random and leases the
// least loaded of those that are not cooling down (falling back to every
// candidate only when all of the sample are). A client can observe a lease
// on a proxy that holds one or two leases more than the least-loaded one of
// a large set; no lease ever goes to a proxy cooling down for its target.
//
// It implements lease.Store and imports nothing of the operator but
// the lease package's types (and the operator's metric names): it never reads or writes the Kubernetes API.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// SampleSize is how many candidates Acquire weighs at most in one script.
const SampleSize = 16

// DefaultKeyPrefix starts every key the store writes, so one Redis can
// serve other uses (or, with other prefixes, several operators).
const DefaultKeyPrefix = "egress-proxies-operator:"

// Options configure a Store.
type Options struct {
	// Client talks to Redis. Its timeouts should be no longer than the
	// discovery API's store timeout, which bounds every call anyway.
	Client redis.UniversalClient
	// KeyPrefix starts every key (DefaultKeyPrefix when empty).
	KeyPrefix string
	// TimeOffset, when set, is added to the Redis server's TIME: tests move
	// the store's clock with it. Nil in production.
	TimeOffset func() time.Duration
	// DurableReplicas is how many replicas must have the writes a failover
	// must not lose (exclusive holds, burned IPs, client bans, the ledger)
	// before they count: each waits for them (WAIT) up to DurableTimeout.
	// Zero: none waits (a standalone Redis).
	DurableReplicas int
	DurableTimeout  time.Duration
}

// Store is the Redis lease store.
type Store struct {
	client redis.UniversalClient
	prefix string
	offset func() time.Duration
	// replicas and waitFor are Options.DurableReplicas and
	// DurableTimeout.
	replicas int
	waitFor  time.Duration
	// versionChecked is set once a Ping found a Redis new enough.
	versionChecked atomic.Bool
}

var _ lease.Store = (*Store)(nil)

// New returns a store over opts.Client; it does not connect until used.
func New(opts Options) *Store {
	s := &Store{client: opts.Client, prefix: opts.KeyPrefix, offset: opts.TimeOffset, replicas: opts.DurableReplicas, waitFor: opts.DurableTimeout}
	if s.waitFor <= 0 {
		s.waitFor = DefaultDurableTimeout
	}
	if s.prefix == "" {
		s.prefix = DefaultKeyPrefix
	}
	if s.offset == nil {
		s.offset = func() time.Duration { return 0 }
	}
	return s
}

// run runs a script with the preamble's arguments first.
func (s *Store) run(ctx context.Context, script *redis.Script, args ...any) *redis.Cmd {
	return script.Run(ctx, s.client, nil, s.scriptArgs(args...)...)
}

// DefaultDurableTimeout is how long a durable write waits for its
// replicas by default.
const DefaultDurableTimeout = 500 * time.Millisecond

// ErrNotReplicated says a write that must survive a failover did not
// reach its replicas in time: it may be lost if the primary is, so it does
// not count (the caller retries, or refuses).
var ErrNotReplicated = errors.New("the write did not reach its replicas in time")

// runDurable runs a script whose writes a failover must not lose and, on
// the same connection, waits until DurableReplicas replicas have them
// (WAIT counts what the connection wrote). The script goes whole (EVAL):
// a pipeline cannot fall back from EVALSHA, and a primary that took over
// has no script cache. err is the wait's; the script's own is in cmd.
func (s *Store) runDurable(ctx context.Context, script *redis.Script, args ...any) (cmd *redis.Cmd, err error) {
	if s.replicas <= 0 {
		return s.run(ctx, script, args...), nil
	}
	pipe := s.client.Pipeline()
	cmd = script.Eval(ctx, pipe, nil, s.scriptArgs(args...)...)
	wait := pipe.Do(ctx, "WAIT", s.replicas, s.waitFor.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if cmd.Err() != nil {
		return cmd, nil
	}
	switch got, werr := wait.Int64(); {
	case werr != nil:
		durableWrites.WithLabelValues("unknown").Inc()
		return cmd, fmt.Errorf("waiting for %d replicas: %w", s.replicas, werr)
	case got < int64(s.replicas):
		durableWrites.WithLabelValues("unreplicated").Inc()
		return cmd, fmt.Errorf("%w: %d of %d replicas within %s", ErrNotReplicated, got, s.replicas, s.waitFor)
	}
	durableWrites.WithLabelValues("replicated").Inc()
	return cmd, nil
}

// scriptArgs are the preamble's arguments (the key prefix, the time
// offset), then args.
func (s *Store) scriptArgs(args ...any) []any {
	all := make([]any, 0, len(args)+2)
	all = append(all, s.prefix, s.offset().Milliseconds())
	return append(all, args...)
}

// Acquire implements lease.Store.
func (s *Store) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	ids := req.Candidates.IDs
	if len(ids) == 0 {
		return lease.Lease{}, &lease.NoProxyAvailableError{}
	}
	if len(ids) > SampleSize {
		l, err := s.acquire(ctx, req, sample(ids, SampleSize), true)
		if !errors.Is(err, lease.ErrNoProxyAvailable) {
			return l, err
		}
		// The whole sample is cooling down: only every candidate can say
		// whether any is not, and when the first cooldown ends.
	}
	return s.acquire(ctx, req, ids, false)
}

// acquire leases one of ids. A random sample (sampled) breaks ties by its
// own order: as fair as when each was last leased, for no read.
func (s *Store) acquire(ctx context.Context, req lease.AcquireRequest, ids []string, sampled bool) (lease.Lease, error) {
	id := uuid.NewString()
	adaptive := flag(req.Adaptive)
	// Declared paces, each sent once (without its bucket, which is the
	// candidate's), and each candidate's index into them and bucket.
	var paces []lease.Pace
	index := map[lease.Pace]int{}
	of := make([]int, len(ids))
	buckets := make([]string, len(ids))
	if req.PaceOf != nil && req.Target != "" {
		for i, c := range ids {
			p := req.PaceOf(c)
			if p.IsZero() {
				continue
			}
			buckets[i], p.Bucket = p.Bucket, ""
			if _, ok := index[p]; !ok {
				paces = append(paces, p)
				index[p] = len(paces)
			}
			of[i] = index[p]
		}
	}
	exclusive := flag(req.Exclusive)
	args := make([]any, 0, 12+6*len(paces)+3*len(ids))
	args = append(args, req.TTL.Milliseconds(), req.Target, id, adaptive, req.MaxWait.Milliseconds(), len(paces), req.Holder, req.Limit.Key, req.Limit.Max,
		exclusive, req.Within, flag(sampled))
	for _, p := range paces {
		args = append(args, p.Interval.Milliseconds(), p.Burst, p.MaxConcurrent, p.FleetKey, p.FleetInterval.Milliseconds(), p.FleetBurst)
	}
	for i, c := range ids {
		args = append(args, c, of[i], buckets[i])
	}
	var cmd *redis.Cmd
	var durable error
	if req.Exclusive {
		// An exclusive hold a failover lost could be granted twice.
		cmd, durable = s.runDurable(ctx, acquireScript, args...)
	} else {
		cmd = s.run(ctx, acquireScript, args...)
	}
	res, err := cmd.Slice()
	if err != nil {
		return lease.Lease{}, fmt.Errorf("acquire script: %w", err)
	}
	if durable != nil && len(res) == 8 {
		// Not held where a failover would keep it: give it back (if the
		// primary still has it) and refuse, as with a store that is away.
		_ = s.Release(context.WithoutCancel(ctx), id)
		return lease.Lease{}, fmt.Errorf("%w: an exclusive hold: %w", lease.ErrStoreUnavailable, durable)
	}
	if len(res) == 3 {
		wait, _ := res[1].(int64)
		cause, _ := res[2].(string)
		if cause == "quota" {
			return lease.Lease{}, &lease.QuotaExceededError{RetryAfter: time.Duration(wait) * time.Millisecond}
		}
		return lease.Lease{}, &lease.NoProxyAvailableError{RetryAfter: time.Duration(wait) * time.Millisecond, Cause: cause}
	}
	if len(res) != 8 {
		return lease.Lease{}, fmt.Errorf("acquire script answered %d values, want 8", len(res))
	}
	l, err := leaseOf(id, req.Target, res[1], res[2], res[3], res[4])
	wait, _ := res[5].(int64)
	paced, _ := res[6].(int64)
	why, _ := res[7].(int64)
	l.Wait, l.Paced, l.Holder, l.Exclusive = time.Duration(wait)*time.Millisecond, paced == 1, req.Holder, req.Exclusive
	l.Why = [...]string{lease.WhyLeastLoaded, lease.WhyBetterRecord, lease.WhySoonestSlot}[min(max(why, 0), 2)]
	return l, err
}

// learnedTTL is how long a learned pace is kept after its last push-back:
// long enough to halve from the longest interval to under the shortest.
const learnedTTL = 14 * lease.LearnedHalfLife

// flag is a script's boolean argument: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Slot implements lease.Store.
func (s *Store) Slot(ctx context.Context, proxy, target string, p lease.Pace, adaptive bool, maxWait time.Duration) (time.Duration, error) {
	res, err := s.run(ctx, slotScript, p.BucketOf(proxy), target, p.Interval.Milliseconds(), p.Burst, p.FleetKey, p.FleetInterval.Milliseconds(), p.FleetBurst,
		flag(adaptive), maxWait.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("slot script: %w", err)
	}
	if res[0] == 0 {
		return 0, &lease.NoProxyAvailableError{RetryAfter: time.Duration(res[1]) * time.Millisecond, Cause: lease.CausePaced}
	}
	return time.Duration(res[1]) * time.Millisecond, nil
}

// PushBack implements lease.Store.
func (s *Store) PushBack(ctx context.Context, host string, retryAfter time.Duration) (lease.Learned, error) {
	return learnedFrom(s.run(ctx, pushBackScript, host, retryAfter.Milliseconds()), "push-back")
}

// LearnedPace implements lease.Store.
func (s *Store) LearnedPace(ctx context.Context, host string) (lease.Learned, error) {
	return learnedFrom(s.run(ctx, learnedScript, host), "learned pace")
}

func learnedFrom(cmd *redis.Cmd, what string) (lease.Learned, error) {
	n, err := cmd.Int64Slice()
	if err != nil {
		return lease.Learned{}, fmt.Errorf("%s script: %w", what, err)
	}
	if len(n) != 3 {
		return lease.Learned{}, fmt.Errorf("%s script answered %d values, want 3", what, len(n))
	}
	if n[0] == 0 {
		return lease.Learned{}, nil
	}
	return lease.Learned{Interval: time.Duration(n[0]) * time.Millisecond, Since: time.UnixMilli(n[1]).UTC(), PushBacks: int(n[2])}, nil
}

// sample draws n distinct ids at random, n < len(ids), in O(n): the
// caller's slice is shared, so it is neither copied nor shuffled.
func sample(ids []string, n int) []string {
	out := make([]string, 0, n)
	picked := make(map[int]bool, n)
	for len(out) < n {
		i := mathrand.IntN(len(ids))
		if !picked[i] {
			picked[i] = true
			out = append(out, ids[i])
		}
	}
	return out
}

// Get implements lease.Store.
func (s *Store) Get(ctx context.Context, id string) (lease.Lease, error) {
	return s.leaseFrom(id, s.run(ctx, getScript, id))
}

// Renew implements lease.Store.
func (s *Store) Renew(ctx context.Context, id string, ttl time.Duration) (lease.Lease, error) {
	return s.leaseFrom(id, s.run(ctx, renewScript, id, ttl.Milliseconds()))
}

// leaseFrom reads a get or renew script's answer.
func (s *Store) leaseFrom(id string, cmd *redis.Cmd) (lease.Lease, error) {
	res, err := cmd.Slice()
	if errors.Is(err, redis.Nil) {
		return lease.Lease{}, lease.ErrLeaseNotFound
	}
	if err != nil {
		return lease.Lease{}, fmt.Errorf("lease script: %w", err)
	}
	if len(res) != 7 {
		return lease.Lease{}, fmt.Errorf("lease script answered %d values, want 7", len(res))
	}
	target, _ := res[1].(string)
	l, err := leaseOf(id, target, res[0], res[2], res[3], res[4])
	l.Holder, _ = res[5].(string)
	excl, _ := res[6].(int64)
	l.Exclusive = excl == 1
	return l, err
}

func leaseOf(id, target string, proxy, created, expires, load any) (lease.Lease, error) {
	p, ok1 := proxy.(string)
	c, ok2 := created.(int64)
	e, ok3 := expires.(int64)
	n, ok4 := load.(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return lease.Lease{}, fmt.Errorf("lease script answered %T %T %T %T, want string and three integers", proxy, created, expires, load)
	}
	return lease.Lease{ID: id, ProxyID: p, Target: target, CreatedAt: time.UnixMilli(c).UTC(), ExpiresAt: time.UnixMilli(e).UTC(), ProxyLeases: int(n)}, nil
}

// Release implements lease.Store.
func (s *Store) Release(ctx context.Context, id string) error {
	if err := s.run(ctx, releaseScript, id).Err(); err != nil {
		return fmt.Errorf("release script: %w", err)
	}
	return nil
}

// Report implements lease.Store.
func (s *Store) Report(ctx context.Context, id, result, target string, cooldown time.Duration) error {
	live, err := s.run(ctx, reportScript, id, result, target, cooldown.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("report script: %w", err)
	}
	if live == 0 {
		return lease.ErrLeaseNotFound
	}
	return nil
}

// Route implements lease.Store.
func (s *Store) Route(ctx context.Context, session, host string) (lease.Route, error) {
	vals, err := s.run(ctx, routeScript, session, host).StringSlice()
	if err != nil {
		return lease.Route{}, fmt.Errorf("route script: %w", err)
	}
	if len(vals) != 7 {
		return lease.Route{}, fmt.Errorf("route script: %d values, want 7", len(vals))
	}
	r := lease.Route{Own: vals[0], Detour: vals[1], IP: vals[3], Hold: vals[4]}
	if vals[5] != "" {
		if r.Score, err = strconv.ParseFloat(vals[5], 64); err != nil {
			return lease.Route{}, fmt.Errorf("route script: score %q: %w", vals[5], err)
		}
	}
	if vals[6] != "" {
		if r.Uses, err = strconv.ParseInt(vals[6], 10, 64); err != nil {
			return lease.Route{}, fmt.Errorf("route script: uses %q: %w", vals[6], err)
		}
	}
	if vals[2] != "" {
		ms, err := strconv.ParseInt(vals[2], 10, 64)
		if err != nil {
			return lease.Route{}, fmt.Errorf("route script: since %q: %w", vals[2], err)
		}
		r.Since = time.UnixMilli(ms).UTC()
	}
	return r, nil
}

// SetRoute implements lease.Store.
func (s *Store) SetRoute(ctx context.Context, session, host string, set lease.RouteSet) error {
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	if err := s.run(ctx, setRouteScript, session, host, set.Proxy, flag(set.Own), set.Idle.Milliseconds(), flag(set.Fresh), set.IP, set.Hold).Err(); err != nil {
		return fmt.Errorf("set route script: %w", err)
	}
	return nil
}

// ReportSession implements lease.Store.
func (s *Store) ReportSession(ctx context.Context, r lease.SessionReport) (string, error) {
	proxy, err := s.run(ctx, reportSessionScript, r.Session, r.Result, r.Target, r.Cooldown.Milliseconds(), r.Window.Milliseconds(), r.Reporter, r.Client,
		strconv.FormatFloat(r.Score, 'f', -1, 64)).Text()
	if err != nil {
		return "", fmt.Errorf("report session script: %w", err)
	}
	if proxy == "" {
		return "", lease.ErrSessionNotFound
	}
	return proxy, nil
}

// MarkSession implements lease.Store.
func (s *Store) MarkSession(ctx context.Context, session, proxy string, delta float64) (float64, error) {
	score, err := s.run(ctx, markSessionScript, session, proxy, strconv.FormatFloat(delta, 'f', -1, 64)).Text()
	if errors.Is(err, redis.Nil) {
		return 0, lease.ErrSessionNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("mark session script: %w", err)
	}
	return strconv.ParseFloat(score, 64)
}

// loadsChunk bounds one script's proxies, so that listing a large fleet
// never holds Redis for long in one go.
const loadsChunk = 1000

// Held implements lease.Store.
func (s *Store) Held(ctx context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	for start := 0; start < len(ids); start += loadsChunk {
		chunk := ids[start:min(start+loadsChunk, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		held, err := s.run(ctx, heldScript, args...).Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("held script: %w", err)
		}
		if len(held) != len(chunk) {
			return nil, fmt.Errorf("held script answered %d values for %d proxies", len(held), len(chunk))
		}
		for i, h := range held {
			out[start+i] = h == 1
		}
	}
	return out, nil
}

// ActiveLeases implements lease.Store: one script per thousand ids,
// sent in one pipeline.
func (s *Store) ActiveLeases(ctx context.Context, ids []string) ([]int, error) {
	out := make([]int, 0, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	cmds, err := s.loads(ctx, ids)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		// A pipeline does not fall back to EVAL: load the script (a new or
		// restarted Redis has none) and send it once more.
		if err := loadsScript.Load(ctx, s.client).Err(); err != nil {
			return nil, fmt.Errorf("loading the loads script: %w", err)
		}
		cmds, err = s.loads(ctx, ids)
	}
	if err != nil {
		return nil, fmt.Errorf("loads script: %w", err)
	}
	for _, cmd := range cmds {
		counts, err := cmd.Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("loads script: %w", err)
		}
		for _, n := range counts {
			out = append(out, int(n))
		}
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("loads script answered %d counts for %d proxies", len(out), len(ids))
	}
	return out, nil
}

// loads sends the loads script over ids in chunks, in one pipeline.
func (s *Store) loads(ctx context.Context, ids []string) ([]*redis.Cmd, error) {
	pipe := s.client.Pipeline()
	var cmds []*redis.Cmd
	for start := 0; start < len(ids); start += loadsChunk {
		chunk := ids[start:min(start+loadsChunk, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		cmds = append(cmds, loadsScript.EvalSha(ctx, pipe, nil, s.scriptArgs(args...)...))
	}
	_, err := pipe.Exec(ctx)
	return cmds, err
}

// Admit implements lease.Store.
func (s *Store) Admit(ctx context.Context, key string, interval time.Duration, burst int) error {
	wait, err := s.run(ctx, admitScript, key, interval.Milliseconds(), burst).Int64()
	if err != nil {
		return fmt.Errorf("admit script: %w", err)
	}
	if wait > 0 {
		return &lease.QuotaExceededError{RetryAfter: time.Duration(wait) * time.Millisecond}
	}
	return nil
}

// AddUsage implements lease.Store.
func (s *Store) AddUsage(ctx context.Context, key string, n int64, ttl time.Duration) (int64, error) {
	total, err := s.run(ctx, addUsageScript, key, n, ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("add-usage script: %w", err)
	}
	return total, nil
}

// Ping implements lease.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis PING: %w", err)
	}
	if s.versionChecked.Load() {
		return nil
	}
	info := s.client.InfoMap(ctx, "server")
	if err := info.Err(); err != nil {
		return fmt.Errorf("redis INFO server: %w", err)
	}
	if err := checkVersion(info.Item("Server", "redis_version")); err != nil {
		return err
	}
	s.versionChecked.Store(true)
	return nil
}

// minMajor.minMinor is the oldest Redis the scripts run on (PEXPIRE's
// GT came in 7.0).
const minMajor, minMinor = 7, 0

// checkVersion says whether the scripts run on Redis version v (INFO
// server's redis_version): on an older Redis every lease would fail with a
// script error, so the store reports not ready, saying why.
func checkVersion(v string) error {
	if v == "" {
		return errors.New("redis INFO server names no redis_version")
	}
	parts := strings.SplitN(v, ".", 3)
	major, err := strconv.Atoi(parts[0])
	minor := 0
	if err == nil && len(parts) > 1 {
		minor, err = strconv.Atoi(parts[1])
	}
	if err != nil {
		return fmt.Errorf("redis_version %q: %w", v, err)
	}
	if major < minMajor || major == minMajor && minor < minMinor {
		return fmt.Errorf("redis %s: the lease store needs Redis %d.%d or later", v, minMajor, minMinor)
	}
	return nil
}

// Counts are the live leases and cooldowns, for metrics.
func (s *Store) Counts(ctx context.Context) (leases, cooldowns int, err error) {
	n, err := s.run(ctx, countsScript).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("counts script: %w", err)
	}
	if len(n) != 2 {
		return 0, 0, fmt.Errorf("counts script answered %d values, want 2", len(n))
	}
	return int(n[0]), int(n[1]), nil
}

// Collectors are the store's gauges, counted in Redis at scrape time
// (bounded by timeout); a scrape while Redis is away reports them invalid
// rather than zero.
func (s *Store) Collectors(timeout time.Duration) []prometheus.Collector {
	return append(lease.CountCollectors(func() (int, int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return s.Counts(ctx)
	}), durableWrites)
}

// durableWrites counts the writes that waited for their replicas.
var durableWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Subsystem: "lease_store", Name: "durable_writes_total",
	Help: "Writes a Redis failover must not lose (exclusive holds, burned IPs, client bans, ledger records), by outcome: replicated (--redis-wait-replicas had them in time), unreplicated (refused or retried), unknown (the wait failed).",
}, []string{"outcome"})
