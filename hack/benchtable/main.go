// Command benchtable turns `go test -bench` output into the table `make
// bench` prints: each of the project's figures beside its baseline from the
// same run, and how many times the baseline's cost it is.
//
// A benchmark pairs its figures by unit name: a figure in unit
// "<who>_<what>" (api_req/s, operator_s) is the project's, and the figure in
// unit "bare_<what>" of the same benchmark is its baseline, the limit
// measured on the same machine in the same run. Figures without a partner
// are listed below the table.
//
// Usage:
//
//	go test -run '^$' -bench . ./... | benchtable -out bench/results
//
// It writes the table to standard output and, with -out, a file named after
// the date holding the machine, the table and the raw output (which
// benchstat reads as it is).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/perf/benchfmt"
)

func main() {
	out := flag.String("out", "", "folder to write the dated results file into (none: standard output only)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "benchtable: reads the benchmark output from standard input; got arguments", flag.Args())
		os.Exit(2)
	}
	if err := run(os.Stdin, os.Stdout, *out, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, stdout io.Writer, outDir string, now time.Time) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("reading the benchmark output: %w", err)
	}
	rep, err := parse(raw)
	if err != nil {
		return err
	}
	var table bytes.Buffer
	rep.write(&table, now)
	if _, err := stdout.Write(table.Bytes()); err != nil {
		return err
	}
	if outDir == "" {
		return nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", outDir, err)
	}
	path := filepath.Join(outDir, now.UTC().Format("2006-01-02T150405Z")+".md")
	body := append(table.Bytes(), "\n## Raw output\n\nbenchstat reads this file as it is.\n\n```\n"...)
	body = append(append(body, raw...), "```\n"...)
	if err := os.WriteFile(path, body, 0o644); err != nil {
		return fmt.Errorf("writing the results file: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "\nwritten to %s\n", path)
	return err
}

// figure is one measured quantity of one benchmark, averaged over its runs.
type figure struct {
	bench, unit string
	sum         float64
	runs        int
}

func (f *figure) mean() float64 { return f.sum / float64(f.runs) }

// row is a project figure beside its baseline.
type row struct {
	bench, what, who string
	project, bare    float64
}

// timesTheLimit is how many times the baseline's cost the project's figure
// is: for a rate (a unit per second, more is better) baseline ÷ project,
// for anything else (time, bytes, writes) project ÷ baseline. Above 1 the
// project costs more than the limit.
func (r row) timesTheLimit() float64 {
	if strings.HasSuffix(r.what, "/s") {
		return r.bare / r.project
	}
	return r.project / r.bare
}

type report struct {
	cpu, goos, goarch string
	rows              []row
	unpaired          []*figure
}

const barePrefix = "bare_"

// parse reads the benchmark results and pairs their figures. Output with no
// benchmark result, or a benchmark line it cannot read, is an error: a
// table with a hole in it should not pass for a run.
func parse(raw []byte) (*report, error) {
	rep := &report{}
	var order []string
	figures := map[string]*figure{} // by bench + "\x00" + unit
	r := benchfmt.NewReader(bytes.NewReader(raw), "bench output")
	var syntaxErrs []error
	for r.Scan() {
		switch rec := r.Result().(type) {
		case *benchfmt.SyntaxError:
			syntaxErrs = append(syntaxErrs, rec)
		case *benchfmt.Result:
			rep.cpu, rep.goos, rep.goarch = orElse(rec.GetConfig("cpu"), rep.cpu), orElse(rec.GetConfig("goos"), rep.goos), orElse(rec.GetConfig("goarch"), rep.goarch)
			bench := benchName(rec.Name)
			for _, v := range rec.Values {
				key := bench + "\x00" + v.Unit
				f, ok := figures[key]
				if !ok {
					f = &figure{bench: bench, unit: v.Unit}
					figures[key] = f
					order = append(order, key)
				}
				f.sum += v.Value
				f.runs++
			}
		}
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("reading the benchmark output: %w", err)
	}
	if len(syntaxErrs) > 0 {
		return nil, fmt.Errorf("unreadable benchmark lines: %w", errors.Join(syntaxErrs...))
	}
	if len(order) == 0 {
		return nil, errors.New("the output holds no benchmark result: did every benchmark fail or get filtered out?")
	}
	paired := map[string]bool{}
	for _, key := range order {
		base := figures[key]
		what, ok := strings.CutPrefix(base.unit, barePrefix)
		if !ok {
			continue
		}
		for _, other := range order {
			f := figures[other]
			who, matches := strings.CutSuffix(f.unit, "_"+what)
			if f.bench != base.bench || !matches || who == "" || f.unit == base.unit || strings.Contains(who, "_") {
				continue
			}
			rep.rows = append(rep.rows, row{bench: f.bench, what: what, who: who, project: f.mean(), bare: base.mean()})
			paired[key], paired[other] = true, true
		}
	}
	for _, key := range order {
		f := figures[key]
		// A benchmark whose figures are custom reports ns/op 0: not a figure.
		if !paired[key] && (f.unit != "ns/op" || f.mean() != 0) {
			rep.unpaired = append(rep.unpaired, f)
		}
	}
	return rep, nil
}

// benchName is a benchmark's name without the GOMAXPROCS suffix, which
// says nothing the table's header does not.
func benchName(n benchfmt.Name) string {
	base, parts := n.Parts()
	name := string(base)
	for _, p := range parts {
		if !bytes.HasPrefix(p, []byte("-")) {
			name += string(p)
		}
	}
	return name
}

func (rep *report) write(w io.Writer, now time.Time) {
	fmt.Fprintf(w, "# Benchmark results\n\n")
	fmt.Fprintf(w, "- date: %s\n- cpu: %s\n- cores: %d\n- platform: %s/%s, %s\n\n",
		now.UTC().Format(time.RFC3339), orElse(rep.cpu, "unknown"), runtime.NumCPU(), rep.goos, rep.goarch, runtime.Version())
	fmt.Fprintf(w, "× limit: how many times the baseline's cost the project's figure is (for rates, baseline ÷ project; otherwise project ÷ baseline).\n\n")
	fmt.Fprintf(w, "| benchmark | figure | project | baseline | × limit |\n|---|---|---:|---:|---:|\n")
	for _, r := range rep.rows {
		fmt.Fprintf(w, "| %s | %s (%s vs bare) | %s | %s | %.2f |\n", r.bench, r.what, r.who, number(r.project), number(r.bare), r.timesTheLimit())
	}
	if len(rep.unpaired) > 0 {
		fmt.Fprintf(w, "\nFigures without a baseline:\n\n")
		slices.SortStableFunc(rep.unpaired, func(a, b *figure) int { return strings.Compare(a.bench, b.bench) })
		for _, f := range rep.unpaired {
			fmt.Fprintf(w, "- %s: %s %s\n", f.bench, number(f.mean()), f.unit)
		}
	}
}

// number prints three significant figures, and whole numbers from 100 up
// (9200, not 9.2e+03).
func number(v float64) string {
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func orElse(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
