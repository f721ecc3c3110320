// Command consumers turns the output of make bench-consumers
// (bench/results/consumers.txt and consumers-pinned.txt: go test -bench of
// the consumers' modules, each between two uptime lines; the second with the
// servers on CPU 0 and the client on CPU 1) into the tables of
// docs/benchmarks.md, "Consumers: CPU per message", between its markers,
// and into bench/results/consumers.md: for each run, idem against the
// dedup a team writes by hand (per broker: bare, hand-written dedup, idem's
// single and batch paths, and the batch path's ratios to the hand-written
// one), then every benchmark's row.
//
//	cd bench && go run ./consumers
package main

import (
	"bufio"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem/bench/internal/baseline"
)

const (
	in     = "results/consumers.txt"
	pinned = "results/consumers-pinned.txt"
	out    = "results/consumers.md"
	doc    = "../docs/benchmarks.md"
	begin  = "<!-- bench-consumers: make bench-consumers writes this table -->"
	end    = "<!-- /bench-consumers -->"
	metric = `([0-9.]+) (msgs/s|msgs/batch|client-cpu-µs/msg|redis-cpu-µs/msg|broker-cpu-µs/msg)`
)

// row is one benchmark's runs: each metric's values, by name.
type row struct {
	pkg, name string
	runs      map[string][]float64
}

func main() {
	log.SetFlags(0)
	var b strings.Builder
	for _, f := range []struct{ file, title string }{
		{in, "Unpinned: the client, Redis and the broker share the 2 cores."},
		{pinned, "Pinned: Redis and the broker on CPU 0, the client on CPU 1 (`taskset`)."},
	} {
		rows, t, err := table(f.file)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s\n", f.title, t)
		if h := handTable(rows); h != "" {
			fmt.Fprintf(&b, "%s\n", h)
		}
	}
	tables := b.String()
	if err := os.WriteFile(out, []byte(tables), 0o644); err != nil {
		log.Fatal(err)
	}
	d, err := os.ReadFile(doc)
	if err != nil {
		log.Fatal(err)
	}
	i, j := strings.Index(string(d), begin), strings.Index(string(d), end)
	if i < 0 || j < i {
		log.Fatalf("%s has no %q … %q block", doc, begin, end)
	}
	nd := string(d[:i+len(begin)]) + "\n" + tables + string(d[j:])
	if err := os.WriteFile(doc, []byte(nd), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Print(tables)
}

// table is the markdown table of one go test -bench output, with the
// lines the output holds besides the benchmarks' (pinned: …) as notes.
func table(file string) ([]*row, string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	var (
		rows  []*row
		by    = map[string]*row{}
		pkg   string
		loads []string
		notes []string
		cpu   string
	)
	name := regexp.MustCompile(`^Benchmark(\S+?)(-\d+)?\s+\d+\s`)
	metrics := regexp.MustCompile(metric)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "load average"):
			loads = append(loads, strings.TrimSpace(line[strings.Index(line, "load average"):]))
		case strings.HasPrefix(line, "pkg: "):
			pkg = filepath.Base(strings.TrimPrefix(line, "pkg: "))
		case strings.HasPrefix(line, "cpu: "):
			cpu = strings.TrimPrefix(line, "cpu: ")
		case strings.HasPrefix(line, "pinned: ") && strings.Contains(line, "left out"):
			notes = append(notes, strings.TrimPrefix(line, "pinned: "))
		}
		m := name.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := pkg + " " + m[1]
		r := by[key]
		if r == nil {
			r = &row{pkg: pkg, name: m[1], runs: map[string][]float64{}}
			by[key] = r
			rows = append(rows, r)
		}
		for _, mm := range metrics.FindAllStringSubmatch(line, -1) {
			v, _ := strconv.ParseFloat(mm[1], 64)
			r.runs[mm[2]] = append(r.runs[mm[2]], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, "", err
	}
	if len(rows) == 0 {
		return nil, "", fmt.Errorf("no benchmark lines in %s", file)
	}
	baseline := 0.0
	for _, r := range rows {
		if r.name == "RedisBaseline" {
			baseline = median(r.runs["redis-cpu-µs/msg"])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s (%s); load average before and after: %s. Provisional: the machine is shared, so the figures move with what else runs; medians of %d runs.",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), cpu, strings.Join(loads, " / "), runsOf(rows))
	for _, n := range notes {
		fmt.Fprintf(&b, " %s%s.", strings.ToUpper(n[:1]), n[1:])
	}
	b.WriteString("\n\n| benchmark | msgs/s | msgs/batch | client CPU µs/msg | Redis CPU µs/msg | Redis CPU ÷ SET NX + SET | broker CPU µs/msg | all three µs/msg |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		red := median(r.runs["redis-cpu-µs/msg"])
		ratio := "—"
		if baseline > 0 && red > 0 && r.name != "RedisBaseline" && strings.Contains(r.name, "redis") {
			ratio = fmt.Sprintf("%.2f×", red/baseline)
		}
		all := "—"
		if c, ok := r.runs["client-cpu-µs/msg"]; ok {
			all = strconv.FormatFloat(median(c)+red+median(r.runs["broker-cpu-µs/msg"]), 'f', 1, 64)
		}
		fmt.Fprintf(&b, "| %s %s | %s | %s | %s | %s | %s | %s | %s |\n", r.pkg, r.name, num(r.runs["msgs/s"], 0), num(r.runs["msgs/batch"], 1), num(r.runs["client-cpu-µs/msg"], 1),
			num(r.runs["redis-cpu-µs/msg"], 1), ratio, num(r.runs["broker-cpu-µs/msg"], 1), all)
	}
	return rows, b.String(), nil
}

// handTable is the table of idem against the dedup a team writes by hand:
// per broker and messages in flight, the bare consumer, the hand-written
// dedup, idem's single and batch paths over the same Redis, with the batch
// path's msgs/s, Redis CPU and client CPU per message divided by the
// hand-written dedup's. "" when the run has no hand-written dedup.
func handTable(rows []*row) string {
	by := map[string]*row{}
	for _, r := range rows {
		by[r.pkg+" "+r.name] = r
	}
	var b strings.Builder
	for _, g := range baseline.Groups {
		hand := by[g.Key(g.Hand)]
		if hand == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("Against the dedup a team writes by hand (`ConsumeHandDedup`: per batch a pipelined `SET NX` per message, the handlers, a pipelined `SET` per outcome, then ack or commit), same Redis, same run; the last three columns are idem's batch path ÷ the hand-written dedup.\n\n" +
				"| broker | in flight | consumer | msgs/s | client CPU µs/msg | Redis CPU µs/msg | broker CPU µs/msg | batch ÷ hand: msgs/s | batch ÷ hand: Redis CPU | batch ÷ hand: client CPU |\n" +
				"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		}
		line := func(label string, r *row, ratios bool) {
			if r == nil {
				return
			}
			ratio := func(metric string) string {
				h, v := median(hand.runs[metric]), median(r.runs[metric])
				if !ratios || h <= 0 || v <= 0 {
					return "—"
				}
				return fmt.Sprintf("%.2f", v/h)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", g.Broker, g.InFlight, label,
				num(r.runs["msgs/s"], 0), num(r.runs["client-cpu-µs/msg"], 1), num(r.runs["redis-cpu-µs/msg"], 1), num(r.runs["broker-cpu-µs/msg"], 1),
				ratio("msgs/s"), ratio("redis-cpu-µs/msg"), ratio("client-cpu-µs/msg"))
		}
		line("bare (no dedup)", by[g.Key(g.Bare)], false)
		line("hand-written dedup", hand, false)
		line("idem single path", by[g.Key(g.Single)], false)
		line("idem batch path", by[g.Key(g.Batch)], true)
		for _, o := range g.Others {
			line(o.Label, by[g.Key(o.Name)], false)
		}
	}
	return b.String()
}

func runsOf(rows []*row) int {
	n := 0
	for _, r := range rows {
		n = max(n, len(r.runs["msgs/s"]))
	}
	return n
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func num(v []float64, prec int) string {
	if len(v) == 0 {
		return "—"
	}
	return strconv.FormatFloat(median(v), 'f', prec, 64)
}
