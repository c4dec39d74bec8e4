// Command benchplot draws BenchmarkFleet's curves from a `make bench`
// results file (or raw `go test -bench` output) as one SVG image: for
// each figure, a panel with the fleet size across and a line per replica
// count. docs/performance.md shows the image it writes.
//
// Usage:
//
//	go run ./hack/benchplot -in bench/results/<date>.md -out docs/images/fleet-curves.svg
package main

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
)

func main() {
	in := flag.String("in", "", "a results file of make bench, or raw benchmark output (none: standard input)")
	out := flag.String("out", "", "the SVG file to write (none: standard output)")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	var raw []byte
	var err error
	if in == "" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(in)
	}
	if err != nil {
		return fmt.Errorf("reading the benchmark output: %w", err)
	}
	points, err := parse(raw)
	if err != nil {
		return err
	}
	svg := draw(points, in)
	if out == "" {
		_, err = os.Stdout.Write(svg)
		return err
	}
	if err := os.WriteFile(out, svg, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}

// point is one BenchmarkFleet result: its replicas, its proxies, and its
// figures by unit.
type point struct {
	replicas, proxies int
	figures           map[string]float64
}

// parse reads BenchmarkFleet/replicas=R/proxies=N results.
func parse(raw []byte) ([]point, error) {
	var points []point
	r := benchfmt.NewReader(bytes.NewReader(raw), "bench output")
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			continue
		}
		base, parts := res.Name.Parts()
		if string(base) != "Fleet" {
			continue
		}
		p := point{figures: map[string]float64{}}
		for _, part := range parts {
			key, value, _ := strings.Cut(strings.TrimPrefix(string(part), "/"), "=")
			n, _ := strconv.Atoi(value)
			switch key {
			case "replicas":
				p.replicas = n
			case "proxies":
				p.proxies = n
			}
		}
		for _, v := range res.Values {
			p.figures[v.Unit] = v.Value
		}
		if p.replicas > 0 && p.proxies > 0 {
			points = append(points, p)
		}
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("reading the benchmark output: %w", err)
	}
	if len(points) == 0 {
		return nil, errors.New("no BenchmarkFleet result in the input")
	}
	slices.SortFunc(points, func(a, b point) int { return cmp.Or(a.proxies-b.proxies, a.replicas-b.replicas) })
	return points, nil
}

// panels are the figures drawn, one panel each.
var panels = []struct{ unit, title string }{
	{"age_p99_s", "p99 age of a proxy's last probe (s)"},
	{"probes/s/replica", "probes per second, busiest replica"},
	{"conntrack/replica", "conntrack entries, busiest replica"},
	{"cpu_cores", "CPU, whole process (cores)"},
	{"heap_B/proxy/replica", "heap per proxy per replica (bytes)"},
}

var colours = map[int]string{1: "#d62728", 3: "#1f77b4"}

const (
	panelW, panelH = 360, 230
	marginL        = 70
	marginB        = 40
	marginT        = 30
	cols           = 3
)

// draw is the SVG of points' panels.
func draw(points []point, source string) []byte {
	var sizes []int
	replicaSet := map[int]bool{}
	for _, p := range points {
		if !slices.Contains(sizes, p.proxies) {
			sizes = append(sizes, p.proxies)
		}
		replicaSet[p.replicas] = true
	}
	replicas := make([]int, 0, len(replicaSet))
	for r := range replicaSet {
		replicas = append(replicas, r)
	}
	slices.Sort(replicas)
	rows := (len(panels) + 1 + cols - 1) / cols
	w, h := cols*panelW, rows*panelH+20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	maxSize := float64(sizes[len(sizes)-1])
	for i, panel := range panels {
		x0, y0 := (i%cols)*panelW, (i/cols)*panelH
		plotW, plotH := panelW-marginL-20, panelH-marginT-marginB
		top := 0.0
		for _, p := range points {
			top = math.Max(top, p.figures[panel.unit])
		}
		top = niceCeil(top)
		fmt.Fprintf(&b, `<g transform="translate(%d,%d)">`+"\n", x0, y0)
		fmt.Fprintf(&b, `<text x="%d" y="18" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(panel.title))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", marginL, marginT, plotW, plotH)
		for t := 0; t <= 4; t++ {
			v := top * float64(t) / 4
			y := marginT + plotH - int(float64(plotH)*float64(t)/4)
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#eee"/><text x="%d" y="%d" text-anchor="end">%s</text>`+"\n",
				marginL, marginL+plotW, y, y, marginL-4, y+4, label(v))
		}
		for _, s := range sizes {
			x := marginL + int(float64(plotW)*float64(s)/maxSize)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", x, marginT+plotH+14, label(float64(s)))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">proxies</text>`+"\n", marginL+plotW/2, marginT+plotH+30)
		for _, r := range replicas {
			var path []string
			for _, p := range points {
				if p.replicas != r {
					continue
				}
				v, ok := p.figures[panel.unit]
				if !ok {
					continue
				}
				x := float64(marginL) + float64(plotW)*float64(p.proxies)/maxSize
				y := float64(marginT+plotH) - float64(plotH)*v/top
				path = append(path, fmt.Sprintf("%.1f,%.1f", x, y))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x, y, colours[r])
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(path, " "), colours[r])
		}
		b.WriteString("</g>\n")
	}
	// The legend fills the last cell.
	lx, ly := (len(panels)%cols)*panelW+marginL, (len(panels)/cols)*panelH+marginT
	for i, r := range replicas {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%d replica(s)</text>`+"\n",
			lx, lx+24, ly+20*i, ly+20*i, colours[r], lx+30, ly+20*i+4, r)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">BenchmarkFleet, every 30 s, real CONNECT + TLS probes</text>`+"\n", lx, ly+20*len(replicas)+10)
	if source != "" {
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx, ly+20*len(replicas)+26, html.EscapeString(source))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// niceCeil is v rounded up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// label prints an axis value: 2.5k, 50k, 0.5, 35.
func label(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	case v == math.Trunc(v):
		return strconv.Itoa(int(v))
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
