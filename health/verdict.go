package health

// Verdict is the engine's judgement of one proxy.
type Verdict int

const (
	// Unknown means no verdict yet (a new or replaced proxy).
	Unknown Verdict = iota
	// Healthy means the last successThreshold probes passed.
	Healthy
	// Unhealthy means the last failureThreshold probes failed.
	Unhealthy
)

func (v Verdict) String() string {
	switch v {
	case Healthy:
		return "Healthy"
	case Unhealthy:
		return "Unhealthy"
	default:
		return "Unknown"
	}
}

// tracker counts consecutive identical results and flips the verdict only at
// a threshold, as the kubelet's prober does: a flapping proxy keeps its
// verdict until the evidence agrees long enough.
type tracker struct {
	verdict Verdict
	// lastSuccess and run describe the current streak of identical results.
	lastSuccess bool
	run         int
	// decided is the result that set the verdict, for the condition.
	decided Result
}

// observe records one result and says whether the verdict changed.
func (t *tracker) observe(r Result, failureThreshold, successThreshold int) bool {
	if t.run > 0 && r.Success == t.lastSuccess {
		t.run++
	} else {
		t.lastSuccess, t.run = r.Success, 1
	}
	next := t.verdict
	switch {
	case r.Success && t.run >= successThreshold:
		next = Healthy
	case !r.Success && t.run >= failureThreshold:
		next = Unhealthy
	}
	if next == t.verdict {
		return false
	}
	t.verdict, t.decided = next, r
	return true
}
