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
	"k8s.io/client-go/rest"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
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

// clockTicks is the unit of /proc/<pid>/stat's CPU times: USER_HZ, which
// Linux fixes at 100 for every architecture this project builds for.
const clockTicks = 100

// CPUTime is the CPU time, user and system, that process pid has used so
// far, from /proc/<pid>/stat.
func CPUTime(pid int) (time.Duration, error) {
	_, fields, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	// utime and stime are fields 14 and 15 of the line, 12 and 13 after
	// the name.
	if len(fields) < 13 {
		return 0, fmt.Errorf("process %d: a /proc stat line of %d fields", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("process %d: CPU time %q: %w", pid, f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ControlPlanePIDs are the processes of the API server and etcd that this
// process started (envtest runs them as its children), by name.
func ControlPlanePIDs() (map[string]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	self := os.Getpid()
	pids := map[string]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, fields, err := procStat(pid)
		if err != nil || len(fields) < 2 || (name != "kube-apiserver" && name != "etcd") {
			continue // gone since the listing, or not one of them
		}
		if parent, _ := strconv.Atoi(fields[1]); parent == self {
			pids[name] = pid
		}
	}
	if len(pids) != 2 {
		return nil, fmt.Errorf("found %v among this process's children, not both kube-apiserver and etcd", pids)
	}
	return pids, nil
}

// procStat reads /proc/<pid>/stat: the command name and the fields after
// it. The name, in parentheses, may hold spaces, so the fields are counted
// from its closing parenthesis (fields[0] is the state, fields[1] the
// parent's pid).
func procStat(pid int) (name string, fields []string, err error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", nil, fmt.Errorf("reading /proc stat of process %d: %w", pid, err)
	}
	line := string(data)
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return "", nil, fmt.Errorf("process %d: a /proc stat line without its command name", pid)
	}
	return line[open+1 : end], strings.Fields(line[end+1:]), nil
}

// metricsClient scrapes: a metrics endpoint that hangs must not hang a
// benchmark.
var metricsClient = &http.Client{Timeout: 10 * time.Second}

// ScrapeMetrics reads a Prometheus text endpoint (the operator's, with
// --metrics-secure=false) into its metric families.
func ScrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	return scrapeWith(metricsClient, url)
}

// APIServerClient is an HTTP client with the cluster's admin credentials and
// the URL of the API server's path, for its own endpoints (/metrics,
// /debug/pprof) that no typed client serves.
func (c *Cluster) APIServerClient(path string) (*http.Client, string, error) {
	httpClient, err := rest.HTTPClientFor(c.Env.Config)
	if err != nil {
		return nil, "", fmt.Errorf("an HTTP client for the API server: %w", err)
	}
	return httpClient, strings.TrimSuffix(c.Env.Config.Host, "/") + path, nil
}

// ScrapeAPIServer reads the API server's own /metrics with the cluster's
// admin credentials.
func (c *Cluster) ScrapeAPIServer() (map[string]*dto.MetricFamily, error) {
	httpClient, url, err := c.APIServerClient("/metrics")
	if err != nil {
		return nil, err
	}
	return scrapeWith(httpClient, url)
}

func scrapeWith(httpClient *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	res, err := httpClient.Get(url)
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

// StatusConflicts is how many status writes to the operator's own kinds
// (Proxies, ProxyPools, CrawlTargets) the API server has answered with 409
// Conflict so far: while the operator runs, its own (nothing else writes
// their status; the pods' status is the kubelet's, or the harness's).
// Counted by the API server, not by the writer, so a retry hidden in a
// client counts too.
func (c *Cluster) StatusConflicts() (float64, error) {
	families, err := c.ScrapeAPIServer()
	if err != nil {
		return 0, err
	}
	var conflicts float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		var code, group, subresource string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "code":
				code = l.GetValue()
			case "group":
				group = l.GetValue()
			case "subresource":
				subresource = l.GetValue()
			}
		}
		if code == "409" && group == crawlv1alpha1.GroupVersion.Group && subresource == "status" {
			conflicts += m.GetCounter().GetValue()
		}
	}
	return conflicts, nil
}
