package health

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestFirstProbeDue: when track schedules a proxy's next probe, from what
// it read under the engine's lock (the verdict and the last probe's time
// are a probe worker's to change once the lock is released).
func TestFirstProbeDue(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	settings := Settings{Interval: 30 * time.Second}
	e := NewEngine(Options{}) // no jitter: every row is exact
	cases := []struct {
		name     string
		tracked  tracked
		due      time.Duration
		schedule bool
	}{
		{"replaced: at once", tracked{exists: true, replaced: true, verdict: Healthy}, 0, true},
		{"new, never probed: at once", tracked{}, 0, true},
		{"new to this engine, probed before: spread over the interval (none without jitter)", tracked{everProbed: true}, 0, true},
		{"new settings: an interval after the last probe", tracked{exists: true, resettle: true, lastProbe: now.Add(-5 * time.Second)}, 25 * time.Second, true},
		{"new settings, never probed here: at once", tracked{exists: true, resettle: true}, 0, true},
		{"nothing changed: the schedule stands", tracked{exists: true, lastProbe: now.Add(-5 * time.Second), verdict: Healthy}, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			due, schedule := e.firstProbeDue(c.tracked, settings, now)
			assert.Equal(t, c.schedule, schedule)
			assert.Equal(t, c.due, due)
		})
	}
}

// startLog records when each probe started.
type startLog struct {
	mu     sync.Mutex
	starts []time.Time
}

func (s *startLog) Probe(context.Context, ProbeRequest) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, time.Now())
	return pass
}

func (s *startLog) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.starts)
}

// TestProbesKeepToTheirRate: sixty proxies all due at once, with a bound
// of 30 probes a second, are probed no faster than the bound allows (after
// its burst of 3): each probe starts at least (n-3)/30 s after the first,
// however many workers are free.
func TestProbesKeepToTheirRate(t *testing.T) {
	const proxies, perSecond, burst = 60, 30.0, 3
	probes := &startLog{}
	e := NewEngine(Options{Prober: probes, Workers: 16, Clock: clock.RealClock{}, MaxProbesPerSecond: perSecond,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: time.Hour, Timeout: time.Second, FailureThreshold: 3, SuccessThreshold: 1}})
	for i := range proxies {
		e.track(benchProxy(i, "127.0.0.1:3128"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.runWorkers(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return probes.count() == proxies }, 10*time.Second, 10*time.Millisecond)
	probes.mu.Lock()
	defer probes.mu.Unlock()
	slices.SortFunc(probes.starts, func(a, b time.Time) int { return a.Compare(b) })
	first := probes.starts[0]
	for n, at := range probes.starts {
		earliest := time.Duration(float64(max(0, n-burst)) / perSecond * float64(time.Second))
		require.GreaterOrEqual(t, at.Sub(first), earliest-5*time.Millisecond, "probe %d started %s after the first", n, at.Sub(first))
	}
}

// slowProber takes length of the engine's clock to answer, and records
// when (by that clock) each probe started.
type slowProber struct {
	clock  *clocktesting.FakeClock
	length time.Duration
	startLog
}

func (s *slowProber) Probe(context.Context, ProbeRequest) Result {
	s.mu.Lock()
	s.starts = append(s.starts, s.clock.Now())
	s.mu.Unlock()
	s.clock.Step(s.length)
	return pass
}

// TestIntervalRunsFromProbeStart: a probe that takes 3 s of a 10 s
// interval does not push the next one to 13 s: the next is due 10 s after
// the last started, so a verdict's age stays within an interval and one
// probe's length, however slow the proxy, its canaries or the status write.
func TestIntervalRunsFromProbeStart(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	probes := &slowProber{clock: clk, length: 3 * time.Second}
	e := NewEngine(Options{Prober: probes, Workers: 1, Clock: clk,
		Defaults: Settings{URL: "https://127.0.0.1/", Interval: 10 * time.Second, Timeout: 5 * time.Second, FailureThreshold: 3, SuccessThreshold: 1}})
	e.track(benchProxy(0, "127.0.0.1:3128"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.runWorkers(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	require.Eventually(t, func() bool { return probes.count() == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond, "the next probe is scheduled")
	clk.Step(7 * time.Second) // 10 s after the first probe started
	require.Eventually(t, func() bool { return probes.count() == 2 }, 5*time.Second, time.Millisecond,
		"the second probe starts an interval after the first started, not after it ended")
	probes.mu.Lock()
	defer probes.mu.Unlock()
	assert.Equal(t, 10*time.Second, probes.starts[1].Sub(probes.starts[0]))
}
