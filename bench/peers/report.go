package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/seed-a1b882c0/idem/bench/internal/stats"
)

// meta says where and with what a run was made.
type meta struct {
	Date            string  `json:"date"`
	CPU             string  `json:"cpu"`
	Cores           int     `json:"cores"`
	Go              string  `json:"go"`
	Node            string  `json:"node,omitempty"`
	Powertools      string  `json:"powertools_idempotency,omitempty"`
	AWSSDKJS        string  `json:"aws_sdk_js_client_dynamodb,omitempty"`
	NodeRedis       string  `json:"redis_client_js,omitempty"`
	DynamoDBLocal   string  `json:"dynamodb_local"`
	Redis           string  `json:"redis"`
	Reps            int     `json:"reps"`
	Calls           int     `json:"calls"`
	Keys            int     `json:"keys"`
	Seconds         float64 `json:"seconds"`
	ReproduceSample string  `json:"reproduce"`
}

func (m meta) summary() string {
	return fmt.Sprintf("%s ×%d; %s, node %s, Powertools %s, DynamoDB Local %s, Redis %s",
		m.CPU, m.Cores, m.Go, m.Node, m.Powertools, m.DynamoDBLocal, m.Redis)
}

func collectMeta(ctx context.Context, root string, e *env, nodeDir string) meta {
	m := meta{
		Date:            time.Now().UTC().Format(time.RFC3339),
		CPU:             cpuModel(),
		Cores:           runtime.NumCPU(),
		Go:              runtime.Version(),
		DynamoDBLocal:   dynamoDBLocalVersion(root),
		ReproduceSample: "make bench-peers",
	}
	if info, err := e.admin.Info(ctx, "server").Result(); err == nil {
		if v := regexp.MustCompile(`redis_version:(\S+)`).FindStringSubmatch(info); v != nil {
			m.Redis = v[1]
		}
	}
	if nodeDir == "" {
		return m
	}
	if out, err := exec.CommandContext(ctx, "node", "--version").Output(); err == nil {
		m.Node = strings.TrimSpace(string(out))
	}
	version := func(pkg string) string {
		b, err := os.ReadFile(filepath.Join(nodeDir, "node_modules", pkg, "package.json"))
		if err != nil {
			return ""
		}
		var p struct{ Version string }
		_ = json.Unmarshal(b, &p)
		return p.Version
	}
	m.Powertools = version("@aws-lambda-powertools/idempotency")
	m.AWSSDKJS = version("@aws-sdk/client-dynamodb")
	m.NodeRedis = version("@redis/client")
	return m
}

// dynamoDBLocalVersion reads the version DynamoDB Local logged when
// scripts/dynamodb-local started it (and the npm package it came from).
func dynamoDBLocalVersion(root string) string {
	dir := filepath.Join(root, ".cache", "dynamodb-local")
	pkg := os.Getenv("DYNAMODB_LOCAL_NPM_VERSION")
	if pkg == "" {
		pkg = "2.9.30" // scripts/dynamodb-local's default
	}
	b, _ := os.ReadFile(filepath.Join(dir, "log"))
	if v := regexp.MustCompile(`(?i)version:?\s+(\d+\.\d+\.\d+)`).FindSubmatch(b); v != nil {
		return fmt.Sprintf("%s (npm amplify-dynamodb-simulator %s)", v[1], pkg)
	}
	return "npm amplify-dynamodb-simulator " + pkg
}

// A row is one side of one scenario: medians over the repetitions.
type row struct {
	Scenario   string  `json:"scenario"`
	Side       string  `json:"side"`
	OpsPerS    float64 `json:"ops_per_s"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	CPUus      float64 `json:"cpu_us_per_call"`
	Requests   float64 `json:"requests_per_call"`
	ServerCmds float64 `json:"server_commands_per_call,omitempty"`
	ServerUs   float64 `json:"server_us_per_call,omitempty"`
	// The ratios, on the idem and powertools rows: of the medians.
	VsPeerOps    float64    `json:"vs_peer_ops,omitempty"`   // idem ÷ Powertools throughput (idem row)
	VsPeerCPU    float64    `json:"vs_peer_cpu,omitempty"`   // idem ÷ Powertools CPU per call (idem row)
	VsRawOps     float64    `json:"vs_raw_ops,omitempty"`    // library ÷ its own raw client's throughput
	VsRawCPU     float64    `json:"vs_raw_cpu,omitempty"`    // library ÷ its own raw client's CPU per call
	VsRawServer  float64    `json:"vs_raw_server,omitempty"` // Redis server CPU per call (INFO cpu), library ÷ raw
	Repetitions  int        `json:"repetitions"`
	OpsPerSRange [2]float64 `json:"ops_per_s_range"`
}

func median(xs []float64) float64 { return stats.Median(xs) }

func summarize(scenarios []scenario, samples []sample) []row {
	type k struct{ sc, side string }
	by := map[k]map[int]sample{}
	for _, s := range samples {
		kk := k{s.Scenario, s.Side}
		if by[kk] == nil {
			by[kk] = map[int]sample{}
		}
		by[kk][s.Rep] = s
	}
	col := func(m map[int]sample, f func(sample) float64) []float64 {
		var out []float64
		for _, s := range m {
			out = append(out, f(s))
		}
		return out
	}
	// A ratio is of the two medians, so that it matches the figures shown
	// beside it.
	ratio := func(a, b map[int]sample, f func(sample) float64) float64 {
		if d := median(col(b, f)); d > 0 {
			return median(col(a, f)) / d
		}
		return 0
	}
	ops := func(s sample) float64 { return s.OpsPerS }
	cpu := func(s sample) float64 { return s.CPUus }
	srv := func(s sample) float64 { return s.ServerUs }
	var rows []row
	for _, sc := range scenarios {
		for _, side := range []string{sideIdem, sidePowertools, sideGoRaw, sideNodeRaw} {
			m := by[k{sc.name(), side}]
			if len(m) == 0 {
				continue
			}
			all := col(m, ops)
			r := row{
				Scenario: sc.name(), Side: side, Repetitions: len(m),
				OpsPerS: median(all), P50us: median(col(m, func(s sample) float64 { return s.P50us })),
				P99us: median(col(m, func(s sample) float64 { return s.P99us })), CPUus: median(col(m, cpu)),
				Requests:     median(col(m, func(s sample) float64 { return s.Requests })),
				ServerCmds:   median(col(m, func(s sample) float64 { return s.ServerCmds })),
				ServerUs:     median(col(m, srv)),
				OpsPerSRange: [2]float64{slices.Min(all), slices.Max(all)},
			}
			raw := map[string]string{sideIdem: sideGoRaw, sidePowertools: sideNodeRaw}[side]
			if rm := by[k{sc.name(), raw}]; len(rm) > 0 {
				r.VsRawOps, r.VsRawCPU = ratio(m, rm, ops), ratio(m, rm, cpu)
				if sc.Store == "redis" {
					r.VsRawServer = ratio(m, rm, srv)
				}
			}
			if side == sideIdem {
				if pm := by[k{sc.name(), sidePowertools}]; len(pm) > 0 {
					r.VsPeerOps, r.VsPeerCPU = ratio(m, pm, ops), ratio(m, pm, cpu)
				}
			}
			rows = append(rows, r)
		}
	}
	return rows
}

func f(v float64, prec int) string {
	if v == 0 {
		return "—"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tside\tops/s\tp50 µs\tp99 µs\tCPU µs/call\treq/call\tsrv cmd/call\tsrv CPU µs/call\t÷ Powertools ops\t÷ Powertools CPU\t÷ own raw ops\t÷ own raw srv CPU\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Scenario, r.Side,
			f(r.OpsPerS, 0), f(r.P50us, 0), f(r.P99us, 0), f(r.CPUus, 1), f(r.Requests, 2),
			f(r.ServerCmds, 2), f(r.ServerUs, 1), f(r.VsPeerOps, 2), f(r.VsPeerCPU, 2), f(r.VsRawOps, 2), f(r.VsRawServer, 2))
	}
	tw.Flush()
}

// writeResults writes peers.json (meta, rows, every sample) and peers.csv
// (the rows).
func writeResults(dir string, m meta, rows []row, samples []sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(struct {
		Meta    meta     `json:"meta"`
		Rows    []row    `json:"rows"`
		Samples []sample `json:"samples"`
	}{m, rows, samples}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "peers.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	fd, err := os.Create(filepath.Join(dir, "peers.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(fd)
	_ = w.Write([]string{"scenario", "side", "ops_per_s", "p50_us", "p99_us", "cpu_us_per_call", "requests_per_call",
		"server_commands_per_call", "server_us_per_call", "idem_vs_powertools_ops", "idem_vs_powertools_cpu", "vs_own_raw_ops", "vs_own_raw_cpu", "vs_own_raw_server_us"})
	g := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, r := range rows {
		_ = w.Write([]string{r.Scenario, r.Side, g(r.OpsPerS), g(r.P50us), g(r.P99us), g(r.CPUus), g(r.Requests),
			g(r.ServerCmds), g(r.ServerUs), g(r.VsPeerOps), g(r.VsPeerCPU), g(r.VsRawOps), g(r.VsRawCPU), g(r.VsRawServer)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		fd.Close()
		return err
	}
	if err := fd.Close(); err != nil {
		return err
	}
	var md strings.Builder
	writeMarkdown(&md, m, rows)
	if err := os.WriteFile(filepath.Join(dir, "peers.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Printf("peers: wrote %s, peers.csv and peers.md\n", filepath.Join(dir, "peers.json"))
	return nil
}

// writeMarkdown writes the tables docs/benchmarks.md shows: both libraries
// per scenario with the ratios, and the raw clients; then Redis's own
// figures.
func writeMarkdown(w io.Writer, m meta, rows []row) {
	get := func(sc, side string) (row, bool) {
		for _, r := range rows {
			if r.Scenario == sc && r.Side == side {
				return r, true
			}
		}
		return row{}, false
	}
	var scenarios []string
	for _, r := range rows {
		if !slices.Contains(scenarios, r.Scenario) {
			scenarios = append(scenarios, r.Scenario)
		}
	}
	lat := func(r row) string { return f(r.P50us, 0) + " / " + f(r.P99us, 0) }
	fmt.Fprintf(w, "Median of %d repetitions of %d calls (%s ×%d, %s, node %s, Powertools %s, DynamoDB Local %s, Redis %s).\n\n",
		m.Reps, m.Calls, m.CPU, m.Cores, m.Go, m.Node, m.Powertools, m.DynamoDBLocal, m.Redis)
	fmt.Fprintln(w, "| c=1 / c=16 | idem ÷ Powertools calls/s | idem ÷ Powertools CPU per call | idem ÷ its raw client's calls/s | Powertools ÷ its raw client's calls/s |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
	for _, st := range []struct{ key, name string }{{"dynamodb", "DynamoDB"}, {"redis", "Redis"}} {
		for _, k := range []struct{ key, name string }{{"new", "new"}, {"dup", "duplicate"}, {"cache", "local-cache replay"}} {
			var cols [4][]string
			for _, c := range []string{"1", "16"} {
				sc := st.key + "/" + k.key + "/c=" + c
				i, ok := get(sc, sideIdem)
				if !ok {
					continue
				}
				p, _ := get(sc, sidePowertools)
				cols[0] = append(cols[0], f(i.VsPeerOps, 2)+"×")
				cols[1] = append(cols[1], f(i.VsPeerCPU, 2))
				cols[2] = append(cols[2], f(i.VsRawOps, 2))
				cols[3] = append(cols[3], f(p.VsRawOps, 2))
			}
			if len(cols[0]) == 0 {
				continue
			}
			if k.key == "cache" {
				cols[2], cols[3] = []string{"0 store requests"}, []string{"0 store requests"}
			}
			fmt.Fprintf(w, "| %s %s | %s | %s | %s | %s |\n", st.name, k.name, strings.Join(cols[0], " / "), strings.Join(cols[1], " / "),
				strings.Join(cols[2], " / "), strings.Join(cols[3], " / "))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | idem calls/s | p50 / p99 µs | CPU µs/call | req/call | Powertools calls/s | p50 / p99 µs | CPU µs/call | req/call | idem ÷ Powertools calls/s | idem ÷ Powertools CPU/call | idem ÷ Go raw | Powertools ÷ Node raw |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, sc := range scenarios {
		i, _ := get(sc, sideIdem)
		p, _ := get(sc, sidePowertools)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | **%s** | %s | %s | %s |\n", sc,
			f(i.OpsPerS, 0), lat(i), f(i.CPUus, 1), f(i.Requests, 2),
			f(p.OpsPerS, 0), lat(p), f(p.CPUus, 1), f(p.Requests, 2),
			f(i.VsPeerOps, 2), f(i.VsPeerCPU, 2), f(i.VsRawOps, 2), f(p.VsRawOps, 2))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | Go raw calls/s | p50 / p99 µs | CPU µs/call | Node raw calls/s | p50 / p99 µs | CPU µs/call |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, sc := range scenarios {
		g, ok := get(sc, sideGoRaw)
		n, _ := get(sc, sideNodeRaw)
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", sc, f(g.OpsPerS, 0), lat(g), f(g.CPUus, 1), f(n.OpsPerS, 0), lat(n), f(n.CPUus, 1))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| Redis scenario | side | commands/call | server CPU µs/call | ÷ own raw server CPU |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
	for _, sc := range scenarios {
		if !strings.HasPrefix(sc, "redis/") {
			continue
		}
		for _, side := range []string{sideIdem, sideGoRaw, sidePowertools, sideNodeRaw} {
			if r, ok := get(sc, side); ok {
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", sc, side, f(r.ServerCmds, 2), f(r.ServerUs, 1), f(r.VsRawServer, 2))
			}
		}
	}
}
