// Package benchkit is the project's store benchmark harness: it runs an
// operation from a fixed number of goroutines and reports throughput and
// latency percentiles as benchmark metrics (ops/s, p50-µs, p99-µs), so
// every store is measured the same way with go test -bench.
package benchkit

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Run calls op b.N times in all, from concurrency goroutines; op gets a
// call number unique across goroutines. Any error fails the benchmark.
func Run(b *testing.B, concurrency int, op func(i int) error) {
	b.Helper()
	lat := make([][]time.Duration, concurrency)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for g := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
