package main

import (
	"html"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/example/egress-proxies-operator/health
BenchmarkFleet/replicas=1/proxies=2500-2   1   0 ns/op   31.0 age_p99_s   83.0 probes/s/replica   0.10 cpu_cores   900 heap_B/proxy/replica   9960 conntrack/replica
BenchmarkFleet/replicas=1/proxies=50000-2  1   0 ns/op   33.0 age_p99_s   1667 probes/s/replica   1.40 cpu_cores   880 heap_B/proxy/replica   200040 conntrack/replica
BenchmarkFleet/replicas=3/proxies=2500-2   1   0 ns/op   31.0 age_p99_s   28.0 probes/s/replica   0.10 cpu_cores   950 heap_B/proxy/replica   3360 conntrack/replica
BenchmarkFleet/replicas=3/proxies=50000-2  1   0 ns/op   32.0 age_p99_s   556 probes/s/replica   1.45 cpu_cores   930 heap_B/proxy/replica   66720 conntrack/replica
BenchmarkProbes10k-2   1   899 engine_cpu_us/probe
`

// TestDrawsALinePerReplicaCountInEachPanel: every panel gets a line per
// replica count through that count's points, scaled to the panel.
func TestDrawsALinePerReplicaCountInEachPanel(t *testing.T) {
	points, err := parse([]byte(sample))
	require.NoError(t, err)
	require.Len(t, points, 4, "only BenchmarkFleet's results")
	assert.Equal(t, 2500, points[0].proxies)
	assert.InDelta(t, 66720, points[3].figures["conntrack/replica"], 0.1)
	svg := string(draw(points, "bench/results/x.md"))
	assert.Equal(t, len(panels)*2, strings.Count(svg, "<polyline"), "a line per replica count per panel")
	assert.Equal(t, len(panels)*4, strings.Count(svg, "<circle"), "a dot per point per panel")
	for _, p := range panels {
		assert.Contains(t, svg, html.EscapeString(p.title))
	}
	assert.Contains(t, svg, "50k")
	assert.Contains(t, svg, "3 replica(s)")
}

func TestRefusesOutputWithoutFleetResults(t *testing.T) {
	_, err := parse([]byte("BenchmarkProbes10k-2   1   899 engine_cpu_us/probe\n"))
	require.ErrorContains(t, err, "no BenchmarkFleet result")
}

func TestNiceCeilAndLabels(t *testing.T) {
	assert.InDelta(t, 50.0, niceCeil(33), 0)
	assert.InDelta(t, 2000.0, niceCeil(1667), 0)
	assert.InDelta(t, 1.0, niceCeil(0), 0)
	assert.Equal(t, "2.5k", label(2500))
	assert.Equal(t, "35", label(35))
}
