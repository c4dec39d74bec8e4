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
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return 0, fmt.Errorf("process %d: VmRSS %q: %w", pid, rest, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("process %d has no VmRSS line (has it exited?)", pid)
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
