package health

import (
	"fmt"
	"testing"
	"time"
	"unique"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestTheLastSuspicionIsStampedWhenItEnds: the engine stamps when a probe
// URL was last suspect at the verdict that ends the suspicion, however long
// before the reconciler next looks, and not at all for a URL that never was.
func TestTheLastSuspicionIsStampedWhenItEnds(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	suspect := func(unhealthy, probed int) bool { return unhealthy >= 3 && float64(unhealthy) > 0.3*float64(probed) }
	e := NewEngine(Options{Clock: clk, TargetSuspect: suspect})
	url, other := "https://probe.test/", "https://other.test/"
	targets := make([]*target, 10)
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range targets {
		u := url
		if i == 9 {
			u = other
		}
		targets[i] = &target{managed: true, probeTarget: probeTarget{settings: unique.Make(Settings{URL: u})}}
		e.targets[types.NamespacedName{Namespace: "ns", Name: fmt.Sprint(i)}] = targets[i]
		e.recountLocked(targets[i], false)
	}
	setVerdict := func(i int, v Verdict) {
		targets[i].tracker.verdict = v
		e.recountLocked(targets[i], false)
	}
	lastSuspect := func(u string) time.Time {
		t.Helper()
		require.NotNil(t, e.byURL[u])
		return e.byURL[u].lastSuspect
	}

	for i := range 4 {
		setVerdict(i, Unhealthy) // 4 of 9: suspect from the third
	}
	assert.Equal(t, start, lastSuspect(url))

	clk.Step(time.Minute)
	setVerdict(0, Healthy) // 3 of 9 is still more than 30%
	assert.Equal(t, start.Add(time.Minute), lastSuspect(url), "still suspect: stamped again")

	clk.Step(time.Minute)
	endedAt := clk.Now()
	setVerdict(1, Healthy) // 2 of 9: the suspicion ends with this verdict
	clk.Step(10 * time.Minute)
	setVerdict(2, Healthy) // not suspect before or after: no stamp
	assert.Equal(t, endedAt, lastSuspect(url), "the last moment it was suspect is the verdict that ended it")

	setVerdict(9, Unhealthy)
	assert.True(t, lastSuspect(other).IsZero(), "one failing proxy never makes its URL suspect")

	clk.Step(time.Minute)
	setVerdict(2, Unhealthy)
	setVerdict(4, Unhealthy) // 3 of 9 again: suspect
	clk.Step(time.Minute)
	removedAt := clk.Now()
	e.recountLocked(targets[4], true)
	assert.Equal(t, removedAt, lastSuspect(url), "a proxy forgotten ends a suspicion too")
	assert.Equal(t, 8, e.byURL[url].probed)
}
