package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/example/egress-proxies-operator/discovery
cpu: Test CPU @ 2.00GHz
BenchmarkLeaseRelease10k-2   	       1	         0 ns/op	      9000 api_req/s	     45000 bare_req/s	     69000 api_p99_us	     15000 bare_p99_us
BenchmarkLeaseRelease10k-2   	       1	         0 ns/op	     11000 api_req/s	     45000 bare_req/s	     71000 api_p99_us	     17000 bare_p99_us
PASS
pkg: github.com/example/egress-proxies-operator/test/bench
BenchmarkOperatorMemory10k-2 	       1	         0 ns/op	       200 operator_rss_MiB	        80 bare_rss_MiB	  12 proxies_k
ok  	github.com/example/egress-proxies-operator/test/bench	60s
`

func TestParsePairsEachFigureWithItsBaseline(t *testing.T) {
	rep, err := parse([]byte(sample))
	require.NoError(t, err)
	assert.Equal(t, "Test CPU @ 2.00GHz", rep.cpu)
	require.Len(t, rep.rows, 3)

	rate := rep.rows[0]
	assert.Equal(t, row{bench: "LeaseRelease10k", what: "req/s", who: "api", project: 10000, bare: 45000}, rate, "the two runs are averaged")
	assert.InDelta(t, 4.5, rate.timesTheLimit(), 1e-9, "a rate: baseline ÷ project")

	latency := rep.rows[1]
	assert.Equal(t, "p99_us", latency.what)
	assert.InDelta(t, 70000.0/16000, latency.timesTheLimit(), 1e-9, "a cost: project ÷ baseline")

	memory := rep.rows[2]
	assert.Equal(t, "operator", memory.who)
	assert.InDelta(t, 2.5, memory.timesTheLimit(), 1e-9)

	require.Len(t, rep.unpaired, 1, "ns/op 0 is no figure; proxies_k has no baseline")
	assert.Equal(t, "proxies_k", rep.unpaired[0].unit)
}

func TestRunWritesTheTableAndTheResultsFile(t *testing.T) {
	dir := t.TempDir()
	var stdout bytes.Buffer
	now := time.Date(2026, 12, 3, 9, 30, 0, 0, time.UTC)
	require.NoError(t, run(strings.NewReader(sample), &stdout, dir, now))

	assert.Contains(t, stdout.String(), "| LeaseRelease10k | req/s (api vs bare) | 10000 | 45000 | 4.50 |")
	assert.Contains(t, stdout.String(), "- cpu: Test CPU @ 2.00GHz")
	file, err := os.ReadFile(filepath.Join(dir, "2026-12-03T093000Z.md"))
	require.NoError(t, err)
	table, _, found := strings.Cut(stdout.String(), "\nwritten to")
	require.True(t, found, "stdout names the file")
	assert.True(t, strings.HasPrefix(string(file), table), "the file starts with the table")
	assert.Contains(t, string(file), "BenchmarkOperatorMemory10k-2", "the raw output follows, for benchstat")

	rep, err := parse(file)
	require.NoError(t, err, "benchstat's parser reads the results file back")
	assert.Len(t, rep.rows, 3)
}

func TestParseRefusesOutputWithoutResults(t *testing.T) {
	_, err := parse([]byte("goos: linux\n--- FAIL: BenchmarkX\nFAIL\n"))
	require.ErrorContains(t, err, "no benchmark result")

	_, err = parse([]byte("BenchmarkX-2 1 notanumber ns/op\n"))
	require.ErrorContains(t, err, "unreadable benchmark lines")
}
