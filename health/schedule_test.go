package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
		{"new to this engine, probed before: spread (none without jitter)", tracked{everProbed: true}, 0, true},
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
