package cluster

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ResidentBytes is a process's resident set size, from /proc.
func ResidentBytes(pid int) (float64, error) {
	m, err := ReadProcessMemory(pid)
	return m.Resident, err
}

// ProcessMemory is a process's resident memory in bytes, from
// /proc/<pid>/status: all of it, and its anonymous part (heap, stacks, the
// runtime's own) and file-backed part (the binary's pages in use). A larger
// binary shows in File, a larger heap in Anonymous.
type ProcessMemory struct {
	Resident, Anonymous, File float64
}

// Add adds o to m, for sums over rounds.
func (m *ProcessMemory) Add(o ProcessMemory) {
	m.Resident += o.Resident
	m.Anonymous += o.Anonymous
	m.File += o.File
}

// ReadProcessMemory reads pid's ProcessMemory.
func ReadProcessMemory(pid int) (ProcessMemory, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return ProcessMemory{}, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	defer f.Close()
	var m ProcessMemory
	fields := map[string]*float64{"VmRSS:": &m.Resident, "RssAnon:": &m.Anonymous, "RssFile:": &m.File}
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), "\t")
		field, known := fields[name]
		if !ok || !known {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		if err != nil {
			return ProcessMemory{}, fmt.Errorf("process %d: %s %q: %w", pid, name, rest, err)
		}
		*field = kb * 1024
		found++
	}
	if err := sc.Err(); err != nil {
		return ProcessMemory{}, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	if found != len(fields) {
		return ProcessMemory{}, fmt.Errorf("process %d has no VmRSS, RssAnon or RssFile line (has it exited?)", pid)
	}
	return m, nil
}

// metricsClient scrapes: a metrics endpoint that hangs must not hang a
// benchmark.
var metricsClient = &http.Client{Timeout: 10 * time.Second}

// ScrapeMetrics reads a Prometheus text endpoint (the operator's, with
// --metrics-secure=false) into its metric families.
func ScrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	res, err := metricsClient.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, res.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return families, nil
}
