package health

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

var (
	pass = Result{Success: true, Reason: ReasonProbeSucceeded}
	fail = Result{Reason: ReasonTimeout}
)

func TestTracker(t *testing.T) {
	cases := []struct {
		name                string
		failures, successes int
		results             []Result
		want                []Verdict // after each result
	}{
		{"a new proxy is Unknown until its first verdict", 3, 1,
			[]Result{fail, fail, fail}, []Verdict{Unknown, Unknown, Unhealthy}},
		{"one success makes it Healthy (successThreshold 1)", 3, 1,
			[]Result{pass}, []Verdict{Healthy}},
		{"2 failures then a success stay Healthy", 3, 1,
			[]Result{pass, fail, fail, pass, fail, fail}, []Verdict{Healthy, Healthy, Healthy, Healthy, Healthy, Healthy}},
		{"3 failures flip it; recovery flips it back", 3, 1,
			[]Result{pass, fail, fail, fail, pass}, []Verdict{Healthy, Healthy, Healthy, Unhealthy, Healthy}},
		{"recovery needs successThreshold successes in a row", 1, 2,
			[]Result{fail, pass, fail, pass, pass}, []Verdict{Unhealthy, Unhealthy, Unhealthy, Unhealthy, Healthy}},
		{"failureThreshold 1 flips at once", 1, 1,
			[]Result{pass, fail}, []Verdict{Healthy, Unhealthy}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tr tracker
			var got []Verdict
			changes := 0
			for _, r := range tc.results {
				if tr.observe(r, tc.failures, tc.successes) {
					changes++
				}
				got = append(got, tr.verdict)
			}
			assert.Equal(t, tc.want, got)
			// A change is reported exactly when the verdict moved.
			moves := 0
			prev := Unknown
			for _, v := range got {
				if v != prev {
					moves++
				}
				prev = v
			}
			assert.Equal(t, moves, changes)
		})
	}

	t.Run("the deciding result is kept for the condition", func(t *testing.T) {
		var tr tracker
		tr.observe(Result{Reason: ReasonConnectRefused, Message: "refused"}, 1, 1)
		assert.Equal(t, ReasonConnectRefused, tr.decided.Reason)
		tr.observe(Result{Reason: ReasonTimeout}, 1, 1)
		assert.Equal(t, ReasonConnectRefused, tr.decided.Reason, "a new failure reason alone is not a transition")
	})
}
