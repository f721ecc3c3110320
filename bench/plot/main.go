// Command plot draws the figures of docs/benchmarks.md from bench/results:
//
//	peers-throughput.png  calls/s per scenario, idem and Powertools (with
//	                      each one's raw client), from peers.json
//	engine.png            the core engine benchmarks' ns/op and allocs/op
//	                      before and after issue 17, from engine-before.txt
//	                      and engine-after.txt (go test -bench output)
//	consumers.png         per broker, the bare consumer, the dedup a team
//	                      writes by hand and idem's single and batch paths
//	                      over one Redis: msgs/s as a multiple of the
//	                      hand-written dedup's, CPU per message (client,
//	                      Redis, broker), unpinned and pinned, from
//	                      consumers.txt and consumers-pinned.txt
//
// Run it from the bench module (make bench-plots; make bench-consumers
// draws consumers.png alone with -only consumers):
//
//	go run ./plot [-results results] [-out ../docs/img] [-only name]
//
// A missing input skips its figure with a note; whatever the files hold is
// drawn (medians where a benchmark ran several times).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/seed-a1b882c0/idem/bench/internal/baseline"
	"github.com/seed-a1b882c0/idem/bench/internal/stats"
)

func main() {
	results := flag.String("results", "results", "directory of peers.json, engine-before.txt and engine-after.txt")
	out := flag.String("out", filepath.Join("..", "docs", "img"), "directory the PNGs are written to")
	only := flag.String("only", "", "draw only this figure (its file name without .png)")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	drawn := 0
	for _, fig := range []struct {
		name string
		draw func(results, file string) error
	}{
		{"peers-throughput.png", peersFigure},
		{"engine.png", engineFigure},
		{"consumers.png", consumersFigure},
	} {
		if *only != "" && fig.name != *only+".png" {
			continue
		}
		file := filepath.Join(*out, fig.name)
		err := fig.draw(*results, file)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(os.Stderr, "plot: %s skipped: %v\n", fig.name, err)
		case err != nil:
			fail(fmt.Errorf("%s: %w", fig.name, err))
		default:
			fmt.Println("plot: wrote", file)
			drawn++
		}
	}
	if drawn == 0 {
		fail(errors.New("no figure drawn"))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "plot:", err)
	os.Exit(1)
}

// The series colours: idem blue, Powertools orange, raw clients lighter.
var (
	blue       = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	lightBlue  = color.RGBA{R: 0xae, G: 0xc7, B: 0xe8, A: 0xff}
	orange     = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	lightOrnge = color.RGBA{R: 0xff, G: 0xbb, B: 0x78, A: 0xff}
	grey       = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
)

type series struct {
	name   string
	color  color.Color
	values []float64
	labels []string // each bar's label, in place of the format's when set
}

// bars is a grouped bar chart: one group per label, one bar per series,
// each bar labelled with its value (format).
func bars(title, ylabel string, groups []string, ss []series, format func(float64) string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	w := vg.Points(min(18, 150/float64(max(1, len(ss)*len(groups)/2))))
	top := 0.0
	for j, s := range ss {
		b, err := plotter.NewBarChart(plotter.Values(s.values), w)
		if err != nil {
			return nil, err
		}
		b.Color = s.color
		b.LineStyle.Width = 0
		off := w * vg.Length(float64(j)-float64(len(ss)-1)/2)
		b.Offset = off
		p.Add(b)
		p.Legend.Add(s.name, b)
		xys := make(plotter.XYs, len(s.values))
		labels := make([]string, len(s.values))
		for i, v := range s.values {
			xys[i] = plotter.XY{X: float64(i), Y: v}
			labels[i] = format(v) // "" for no label
			if s.labels != nil {
				labels[i] = s.labels[i]
			}
			top = max(top, v)
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
		if err != nil {
			return nil, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(7)
			l.TextStyle[i].Rotation = 1.5708 // vertical, reading upwards
			l.TextStyle[i].XAlign = draw.XLeft
			l.TextStyle[i].YAlign = draw.YCenter
			l.TextStyle[i].Color = grey
		}
		l.Offset = vg.Point{X: off, Y: vg.Points(2)}
		p.Add(l)
	}
	p.Y.Max = top * 1.45 // room for the labels and the legend
	p.Y.Tick.Marker = ticks{format}
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.NominalX(groups...)
	p.Add(plotter.NewGrid())
	return p, nil
}

// ticks are plot.DefaultTicks with their labels in the bars' format.
type ticks struct{ format func(float64) string }

func (t ticks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = t.format(ts[i].Value)
			if ts[i].Value == 0 || ts[i].Label == "" {
				ts[i].Label = "0"
			}
		}
	}
	return ts
}

func count(v float64) string {
	switch {
	case v == 0:
		return "" // not measured
	case v >= 10_000:
		return strconv.FormatFloat(v/1000, 'f', 0, 64) + "k"
	case v >= 1_000:
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// save writes plots side by side into one PNG.
func save(file string, w, h vg.Length, ps ...*plot.Plot) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(ps), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{ps}, tiles, dc)
	for i, p := range ps {
		p.Draw(canvases[0][i])
	}
	fd, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(fd); err != nil {
		fd.Close()
		return err
	}
	return fd.Close()
}

// peersFile is the part of bench/peers' peers.json drawn here.
type peersFile struct {
	Meta struct {
		CPU        string `json:"cpu"`
		Cores      int    `json:"cores"`
		Powertools string `json:"powertools_idempotency"`
		Reps       int    `json:"reps"`
		Calls      int    `json:"calls"`
	} `json:"meta"`
	Rows []struct {
		Scenario string  `json:"scenario"`
		Side     string  `json:"side"`
		OpsPerS  float64 `json:"ops_per_s"`
	} `json:"rows"`
}

// peersFigure: three panels (DynamoDB, Redis, local cache), calls/s per
// scenario for idem, Powertools and their raw clients.
func peersFigure(results, file string) error {
	b, err := os.ReadFile(filepath.Join(results, "peers.json"))
	if err != nil {
		return err
	}
	var pf peersFile
	if err := json.Unmarshal(b, &pf); err != nil {
		return fmt.Errorf("peers.json: %w", err)
	}
	ops := map[string]float64{}
	for _, r := range pf.Rows {
		ops[r.Scenario+" "+r.Side] = r.OpsPerS
	}
	panel := func(title string, scenarios, groups []string, sides []string) (*plot.Plot, error) {
		style := map[string]series{
			"idem": {name: "idem", color: blue}, "go-raw": {name: "Go raw client", color: lightBlue},
			"powertools": {name: "Powertools " + pf.Meta.Powertools, color: orange}, "node-raw": {name: "Node raw client", color: lightOrnge},
		}
		var ss []series
		for _, side := range sides {
			s := style[side]
			any := false
			for _, sc := range scenarios {
				v := ops[sc+" "+side]
				any = any || v > 0
				s.values = append(s.values, v)
			}
			if any {
				ss = append(ss, s)
			}
		}
		if len(ss) == 0 {
			return nil, nil
		}
		return bars(title, "calls/s (median)", groups, ss, count)
	}
	all := []string{"idem", "go-raw", "powertools", "node-raw"}
	var ps []*plot.Plot
	for _, st := range []struct{ store, title string }{{"dynamodb", "DynamoDB Local"}, {"redis", "Redis"}} {
		p, err := panel(st.title,
			[]string{st.store + "/new/c=1", st.store + "/new/c=16", st.store + "/dup/c=1", st.store + "/dup/c=16"},
			[]string{"new c=1", "new c=16", "dup c=1", "dup c=16"}, all)
		if err != nil {
			return err
		}
		if p != nil {
			ps = append(ps, p)
		}
	}
	p, err := panel("Local cache (in-memory replay)",
		[]string{"dynamodb/cache/c=1", "dynamodb/cache/c=16", "redis/cache/c=1", "redis/cache/c=16"},
		[]string{"DynamoDB c=1", "c=16", "Redis c=1", "c=16"}, []string{"idem", "powertools"})
	if err != nil {
		return err
	}
	if p != nil {
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return errors.New("peers.json has no rows")
	}
	ps[0].Title.Text += fmt.Sprintf("  (%s ×%d; median of %d × %d calls)", pf.Meta.CPU, pf.Meta.Cores, pf.Meta.Reps, pf.Meta.Calls)
	return save(file, vg.Length(len(ps))*5*vg.Inch, 4.5*vg.Inch, ps...)
}

// bench is one benchmark's medians from go test -bench output.
type bench struct{ ns, allocs float64 }

// readBench parses go test -bench -benchmem output: the median ns/op and
// allocs/op of each benchmark (name without the -GOMAXPROCS suffix).
func readBench(file string) (map[string]bench, error) {
	fd, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	ns, allocs := map[string][]float64{}, map[string][]float64{}
	sc := bufio.NewScanner(fd)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := benchName(f[0])
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			switch f[i+1] {
			case "ns/op":
				ns[name] = append(ns[name], v)
			case "allocs/op":
				allocs[name] = append(allocs[name], v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := map[string]bench{}
	for name, v := range ns {
		out[name] = bench{ns: median(v), allocs: median(allocs[name])}
	}
	return out, nil
}

func median(xs []float64) float64 { return stats.Median(xs) }

// benchName is a benchmark's name from its result line's first field,
// without "Benchmark" and the -GOMAXPROCS suffix.
func benchName(field string) string {
	name := strings.TrimPrefix(field, "Benchmark")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i]
		}
	}
	return name
}

// engineFigure: ns/op and allocs/op of the core benchmarks, before and
// after issue 17.
func engineFigure(results, file string) error {
	before, err := readBench(filepath.Join(results, "engine-before.txt"))
	if err != nil {
		return err
	}
	after, err := readBench(filepath.Join(results, "engine-after.txt"))
	if err != nil {
		return err
	}
	names := []string{"NewCall", "Replay", "CacheHit", "Bare"}
	var groups []string
	var bns, ans, ba, aa []float64
	for _, n := range names {
		b, okb := before[n]
		a, oka := after[n]
		if !okb && !oka {
			continue
		}
		groups = append(groups, n)
		bns, ans, ba, aa = append(bns, b.ns), append(ans, a.ns), append(ba, b.allocs), append(aa, a.allocs)
	}
	if len(groups) == 0 {
		return errors.New("no NewCall, Replay, CacheHit or Bare benchmark in engine-before.txt or engine-after.txt")
	}
	nsLabel := func(v float64) string {
		switch {
		case v == 0:
			return "" // not measured
		case v >= 1000:
			return strconv.FormatFloat(v/1000, 'f', 2, 64) + " µs"
		case v >= 10:
			return strconv.FormatFloat(v, 'f', 0, 64) + " ns"
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + " ns"
	}
	pns, err := bars("Engine over memstore: time per call", "ns/op (median of -count 5)", groups,
		[]series{{name: "before issue 17 (f03a8e3)", color: grey, values: bns}, {name: "after", color: blue, values: ans}}, nsLabel)
	if err != nil {
		return err
	}
	pal, err := bars("Allocations per call", "allocs/op", groups,
		[]series{{name: "before issue 17 (f03a8e3)", color: grey, values: ba}, {name: "after", color: blue, values: aa}}, func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) })
	if err != nil {
		return err
	}
	return save(file, 10*vg.Inch, 4*vg.Inch, pns, pal)
}

// readMetrics parses go test -bench output with custom metrics: each
// metric's median per benchmark, named "<package> <benchmark>" (without
// the -GOMAXPROCS suffix).
func readMetrics(file string) (map[string]map[string]float64, error) {
	fd, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	runs := map[string]map[string][]float64{}
	pkg := ""
	sc := bufio.NewScanner(fd)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = filepath.Base(p)
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := benchName(f[0])
		name = pkg + " " + name
		if runs[name] == nil {
			runs[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			runs[name][f[i+1]] = append(runs[name][f[i+1]], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := map[string]map[string]float64{}
	for name, ms := range runs {
		out[name] = map[string]float64{}
		for m, v := range ms {
			out[name][m] = median(v)
		}
	}
	return out, nil
}

// consumersFigure: per broker and messages in flight (baseline.Groups),
// the bare consumer, the dedup a team writes by hand, and idem's single and
// batch paths over the same Redis: msgs/s as a multiple of the
// hand-written dedup's (each bar labelled with its msgs/s), and the CPU per
// message of the client, Redis and the broker, the batch path's bars
// labelled with their ratio to the hand-written dedup. One row of panels
// per run: unpinned (consumers.txt) and, when it has the hand-written
// dedup, pinned (consumers-pinned.txt).
func consumersFigure(results, file string) error {
	free, err := readMetrics(filepath.Join(results, "consumers.txt"))
	if err != nil {
		return err
	}
	pinned, err := readMetrics(filepath.Join(results, "consumers-pinned.txt"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var rows [][]*plot.Plot
	for _, run := range []struct {
		title   string
		metrics map[string]map[string]float64
	}{{"unpinned", free}, {"pinned: servers CPU 0, client CPU 1", pinned}} {
		ps, err := handPanels(run.title, run.metrics)
		if err != nil {
			return err
		}
		if ps != nil {
			rows = append(rows, ps)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("no hand-written dedup (ConsumeHandDedup) in consumers.txt, a run before it was measured: %w", fs.ErrNotExist)
	}
	return saveGrid(file, 22*vg.Inch, vg.Length(len(rows))*5*vg.Inch, rows)
}

// The paths' colours: no dedup grey, the hand-written dedup orange, idem blue.
var paths = []struct {
	name  string
	color color.Color
	bench func(g baseline.Group) string
}{
	{"bare (no dedup)", grey, func(g baseline.Group) string { return g.Bare }},
	{"hand-written dedup (SET NX, SET)", orange, func(g baseline.Group) string { return g.Hand }},
	{"idem single path", lightBlue, func(g baseline.Group) string { return g.Single }},
	{"idem batch path", blue, func(g baseline.Group) string { return g.Batch }},
}

// handPanels are one run's panels of consumersFigure, nil when the run has
// no hand-written dedup.
func handPanels(title string, m map[string]map[string]float64) ([]*plot.Plot, error) {
	var groups []string
	var hands []map[string]float64
	var gs []baseline.Group
	for _, g := range baseline.Groups {
		if h := m[g.Key(g.Hand)]; h != nil {
			groups = append(groups, strings.Replace(g.Broker, " ", "\n", 1)+"\n"+g.InFlight)
			hands = append(hands, h)
			gs = append(gs, g)
		}
	}
	if len(groups) == 0 {
		return nil, nil
	}
	// One panel per metric; series per path, bars per group.
	panel := func(ptitle, ylabel, metric string, relative, ratio bool) (*plot.Plot, error) {
		var ss []series
		for _, p := range paths {
			s := series{name: p.name, color: p.color}
			any := false
			for i, g := range gs {
				v := m[g.Key(p.bench(g))][metric] // 0: not measured, no label
				h := hands[i][metric]
				label := ""
				if v > 0 {
					any = true
					label = strconv.FormatFloat(v, 'f', 0, 64)
					if metric == "msgs/s" {
						label = count(v)
					}
					if ratio && p.name == "idem batch path" && h > 0 {
						label += fmt.Sprintf(" (%.2f×)", v/h)
					}
				}
				if relative {
					if h > 0 {
						v /= h
					} else {
						v = 0
					}
				}
				s.values = append(s.values, v)
				s.labels = append(s.labels, label)
			}
			if any {
				ss = append(ss, s)
			}
		}
		return bars(ptitle, ylabel, groups, ss, func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) })
	}
	rate, err := panel("msgs/s ÷ the hand-written dedup's, "+title, "× hand-written (bars: msgs/s)", "msgs/s", true, false)
	if err != nil {
		return nil, err
	}
	client, err := panel("Client CPU per message, "+title, "µs per message (batch: ÷ hand-written)", "client-cpu-µs/msg", false, true)
	if err != nil {
		return nil, err
	}
	redis, err := panel("Redis CPU per message, "+title, "µs per message (batch: ÷ hand-written)", "redis-cpu-µs/msg", false, true)
	if err != nil {
		return nil, err
	}
	broker, err := panel("Broker CPU per message, "+title, "µs per message", "broker-cpu-µs/msg", false, false)
	if err != nil {
		return nil, err
	}
	return []*plot.Plot{rate, client, redis, broker}, nil
}

// saveGrid writes rows of plots into one PNG.
func saveGrid(file string, w, h vg.Length, rows [][]*plot.Plot) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: len(rows[0]), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(rows, tiles, dc)
	for i, row := range rows {
		for j, p := range row {
			p.Draw(canvases[i][j])
		}
	}
	fd, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(fd); err != nil {
		fd.Close()
		return err
	}
	return fd.Close()
}
