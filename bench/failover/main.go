// Command failover summarises the failover measurements (make failover
// writes them to bench/results/failover/*.json, one file per deployment)
// as the Markdown tables of docs/failover.md: per setting, the rounds, the
// acknowledged calls, the outcomes lost, the failed calls by kind, and the
// failover and recovery times (median and worst).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/seed-a1b882c0/idem/bench/internal/stats"
)

// round is what the tests write per round (idemtest/failover's Round; a
// test kit, which no program of the repository imports).
type round struct {
	Setting    string         `json:"setting"`
	Acked      int            `json:"acknowledged"`
	Lost       int            `json:"lost"`
	Errors     map[string]int `json:"errors"`
	FailoverMs int64          `json:"failover_ms"`
	RecoverMs  int64          `json:"recover_ms"`
}

func main() {
	dir := flag.String("dir", "results/failover", "the folder of the JSON files")
	flag.Parse()
	files, err := filepath.Glob(filepath.Join(*dir, "*.json"))
	if err != nil || len(files) == 0 {
		fmt.Fprintf(os.Stderr, "failover: no JSON files in %s (run make failover)\n", *dir)
		os.Exit(1)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var rounds []round
		if err := json.Unmarshal(b, &rounds); err != nil {
			fmt.Fprintf(os.Stderr, "failover: %s: %v\n", f, err)
			os.Exit(1)
		}
		fmt.Printf("%s\n\n", strings.TrimSuffix(filepath.Base(f), ".json"))
		fmt.Println("| setting | rounds | acknowledged | lost (total) | rounds with a loss | lost per round (max) | failed calls by kind (total) | failover ms (median / max) | last error after the kill, ms (median / max) |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|")
		bySetting := map[string][]round{}
		for _, r := range rounds {
			bySetting[r.Setting] = append(bySetting[r.Setting], r)
		}
		for _, setting := range slices.Sorted(maps.Keys(bySetting)) {
			rs := bySetting[setting]
			acked, lost, lossy, maxLost := 0, 0, 0, 0
			errs := map[string]int{}
			var fo, rec []float64
			for _, r := range rs {
				acked += r.Acked
				lost += r.Lost
				if r.Lost > 0 {
					lossy++
				}
				maxLost = max(maxLost, r.Lost)
				for k, n := range r.Errors {
					errs[k] += n
				}
				fo = append(fo, float64(r.FailoverMs))
				rec = append(rec, float64(r.RecoverMs))
			}
			var kinds []string
			for _, k := range slices.Sorted(maps.Keys(errs)) {
				kinds = append(kinds, fmt.Sprintf("%s %d", k, errs[k]))
			}
			fmt.Printf("| %s | %d | %d | %d | %d | %d | %s | %.0f / %.0f | %.0f / %.0f |\n",
				setting, len(rs), acked, lost, lossy, maxLost, strings.Join(kinds, ", "),
				stats.Median(fo), slices.Max(fo), stats.Median(rec), slices.Max(rec))
		}
		fmt.Println()
	}
}
