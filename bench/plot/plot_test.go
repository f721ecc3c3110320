package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

const benchOutput = `goos: linux
goarch: amd64
pkg: github.com/seed-a1b882c0/idem
cpu: AMD EPYC
BenchmarkBare-2            	1000000000	         0.5027 ns/op	       0 B/op	       0 allocs/op
BenchmarkNewCall-2         	  200000	      5307 ns/op	         1.000 storecalls/op	    1816 B/op	      37 allocs/op
BenchmarkNewCall-2         	  200000	      6045 ns/op	         1.000 storecalls/op	    1816 B/op	      37 allocs/op
BenchmarkNewCall-2         	  200000	      5728 ns/op	         1.000 storecalls/op	    1816 B/op	      36 allocs/op
BenchmarkCacheHit-2        	 1794435	       703.1 ns/op	         0 storecalls/op	     297 B/op	       6 allocs/op
PASS
ok  	github.com/seed-a1b882c0/idem	12.3s
`

func TestReadBench(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "bench.txt")
	if err := os.WriteFile(f, []byte(benchOutput), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readBench(f)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bench{"Bare": {0.5027, 0}, "NewCall": {5728, 37}, "CacheHit": {703.1, 6}}
	if len(got) != len(want) {
		t.Fatalf("readBench = %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v (medians, name without -GOMAXPROCS)", k, got[k], w)
		}
	}
}

// The figures are drawn from whatever the files hold, and a missing
// input skips only its own figure.
func TestFigures(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"engine-before.txt", "engine-after.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(benchOutput), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := engineFigure(dir, filepath.Join(dir, "engine.png")); err != nil {
		t.Fatal(err)
	}
	if err := peersFigure(dir, filepath.Join(dir, "peers.png")); !os.IsNotExist(err) {
		t.Fatalf("peersFigure without peers.json: %v, want not exist", err)
	}
	peers := `{"meta":{"cpu":"x","cores":2,"powertools_idempotency":"2.35.0","reps":1,"calls":10},
		"rows":[{"scenario":"redis/new/c=1","side":"idem","ops_per_s":100},{"scenario":"redis/new/c=1","side":"powertools","ops_per_s":50}]}`
	if err := os.WriteFile(filepath.Join(dir, "peers.json"), []byte(peers), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := peersFigure(dir, filepath.Join(dir, "peers.png")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"engine.png", "peers.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestReadMetrics(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "consumers.txt")
	out := ` 03:10:00 up 1 min,  0 user,  load average: 1.00, 1.00, 1.00
pkg: github.com/seed-a1b882c0/idem/idemnats
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        30.00 broker-cpu-µs/msg	        50.00 client-cpu-µs/msg	        16.00 msgs/batch	      9000 msgs/s	        20.00 redis-cpu-µs/msg
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        40.00 broker-cpu-µs/msg	        60.00 client-cpu-µs/msg	        16.00 msgs/batch	     11000 msgs/s	        30.00 redis-cpu-µs/msg
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        35.00 broker-cpu-µs/msg	        55.00 client-cpu-µs/msg	        16.00 msgs/batch	     10000 msgs/s	        25.00 redis-cpu-µs/msg
pkg: github.com/seed-a1b882c0/idem/idemamqp
BenchmarkConsume/bare/c16   	    5000	    100 ns/op	     20000 msgs/s
`
	if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readMetrics(f)
	if err != nil {
		t.Fatal(err)
	}
	nats := got["idemnats ConsumeBatch/redis/c=16"]
	if nats["msgs/s"] != 10000 || nats["client-cpu-µs/msg"] != 55 || nats["redis-cpu-µs/msg"] != 25 || nats["broker-cpu-µs/msg"] != 35 {
		t.Errorf("idemnats row %v, want the medians 10000 msgs/s, 55/25/35 µs", nats)
	}
	if got["idemamqp Consume/bare/c16"]["msgs/s"] != 20000 {
		t.Errorf("idemamqp row %v (a name without the -GOMAXPROCS suffix, as a pinned run on one CPU writes it)", got["idemamqp Consume/bare/c16"])
	}
}

// consumers.png is drawn from the hand-written dedup's rows and the paths
// beside them; a run without them (before they were measured) skips the
// figure instead of failing bench-plots.
func TestConsumersFigure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := `pkg: github.com/seed-a1b882c0/idem/idemnats
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        30.00 broker-cpu-µs/msg	        50.00 client-cpu-µs/msg	        16.00 msgs/batch	      9000 msgs/s	        20.00 redis-cpu-µs/msg
`
	if err := os.WriteFile(filepath.Join(dir, "consumers.txt"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := consumersFigure(dir, filepath.Join(dir, "consumers.png")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("consumersFigure without ConsumeHandDedup: %v, want a skip (fs.ErrNotExist)", err)
	}
	run := old + `BenchmarkConsume/bare/c=16-2   	    5000	    100 ns/op	        8.000 broker-cpu-µs/msg	        5.000 client-cpu-µs/msg	    100000 msgs/s	         0.1000 redis-cpu-µs/msg
BenchmarkConsume/redis/c=16-2   	    5000	    100 ns/op	        40.00 broker-cpu-µs/msg	        100.0 client-cpu-µs/msg	      8000 msgs/s	        50.00 redis-cpu-µs/msg
BenchmarkConsumeHandDedup/redis/c=16-2   	    5000	    100 ns/op	        20.00 broker-cpu-µs/msg	        20.00 client-cpu-µs/msg	        16.00 msgs/batch	     22000 msgs/s	        10.00 redis-cpu-µs/msg
pkg: github.com/seed-a1b882c0/idem/idemkafka
BenchmarkConsume/bare-2         	    5000	    100 ns/op	         2.500 client-cpu-µs/msg	    400000 msgs/s	         0.1000 redis-cpu-µs/msg
BenchmarkConsume/idemkafka+redis-2         	    5000	    100 ns/op	         80.00 client-cpu-µs/msg	    8000 msgs/s	         60.00 redis-cpu-µs/msg
BenchmarkConsumeHandDedup/redis-2         	    5000	    100 ns/op	         10.00 client-cpu-µs/msg	    32000 msgs/s	         12.00 redis-cpu-µs/msg
`
	if err := os.WriteFile(filepath.Join(dir, "consumers.txt"), []byte(run), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "consumers.png")
	if err := consumersFigure(dir, out); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Errorf("consumers.png: %v", err)
	}
}
