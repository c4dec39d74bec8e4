package manifests

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const monitoringDir = "charts/egress-proxies-operator/monitoring"

// promtool is Debian's promtool, or the test fails saying how to get it.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool (Prometheus's rule checker) is missing: apt-get install prometheus")
	return path
}

func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// TestAlertRules checks the chart's alerts with real Prometheus tooling:
// the rules parse and each alert fires (and stays silent) as its unit
// tests in alerts_test.yaml say.
func TestAlertRules(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot(), monitoringDir)
	out := runPromtool(t, dir, "check", "rules", "alerts.yaml")
	assert.Contains(t, out, "SUCCESS: 5 rules found")
	out = runPromtool(t, dir, "test", "rules", "alerts_test.yaml")
	assert.Contains(t, out, "SUCCESS")

	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(repoFile(t, monitoringDir+"/alerts.yaml"), &file))
	tests := string(repoFile(t, monitoringDir+"/alerts_test.yaml"))
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			assert.Contains(t, tests, "alertname: "+r.Alert, "alert %s has a unit test", r.Alert)
		}
	}
}

// TestDashboardQueries: every PromQL expression of the Grafana dashboard
// parses (promtool checks them as recording rules, Grafana's variables
// aside), and every metric the dashboard and the alerts read is one the
// operator exports.
func TestDashboardQueries(t *testing.T) {
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(repoFile(t, monitoringDir+"/dashboard.json"), &dash))
	require.NotEmpty(t, dash.Panels)
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var exprs []string
	for i, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has a query", p.Title)
		for _, target := range p.Targets {
			rules = append(rules, rule{Record: "dashboard:panel_" + string(rune('a'+i)), Expr: target.Expr})
			exprs = append(exprs, target.Expr)
		}
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dashboard-rules.yaml"), data, 0o644))
	runPromtool(t, dir, "check", "rules", "dashboard-rules.yaml")

	exported := exportedMetrics(t)
	used := regexp.MustCompile(`proxy_operator_[a-z_]+`)
	alerts := string(repoFile(t, monitoringDir+"/alerts.yaml"))
	for _, name := range used.FindAllString(strings.Join(exprs, "\n")+alerts, -1) {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
		assert.True(t, slices.Contains(exported, base), "%s is read by the dashboard or an alert but the operator exports no such metric", name)
	}
}

// exportedMetrics are the metric names the operator's code declares: a
// namespace (operator.MetricsNamespace), an optional subsystem and a name,
// in an Opts struct or a Desc.
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	declared := []*regexp.Regexp{
		regexp.MustCompile(`Namespace:\s*operator\.MetricsNamespace,(?:\s*Subsystem:\s*"([a-z_]*)",)?\s*Name:\s*"([a-z_]+)"`),
		regexp.MustCompile(`BuildFQName\(operator\.MetricsNamespace,\s*"([a-z_]*)",\s*"([a-z_]+)"\)`),
	}
	var names []string
	root := testenv.RepoRoot()
	// Every production package: all but the tests, the tools and what
	// the build leaves around.
	skip := map[string]bool{"test": true, "hack": true, "bin": true, "tmp": true, ".git": true, "node_modules": true}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && skip[d.Name()]:
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, re := range declared {
			for _, m := range re.FindAllStringSubmatch(string(data), -1) {
				names = append(names, prometheus.BuildFQName(operator.MetricsNamespace, m[1], m[2]))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, names, "proxy_operator_healthcheck_total", "the scan finds the metrics")
	return names
}
