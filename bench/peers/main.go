// Command peers runs idem and AWS Powertools for Lambda (TypeScript)'s
// idempotency utility side by side, on the same DynamoDB Local and the same
// Redis, in one run, and prints the ratios docs/benchmarks.md publishes.
//
// Run it from the repository root with DynamoDB Local started by the
// project's script (make bench-peers does this):
//
//	scripts/dynamodb-local run sh -c 'cd bench && go run ./peers'
//	scripts/dynamodb-local run sh -c 'cd bench && go run ./peers -quick'   # 2×300 calls
//
// It installs the Node.js side's pinned packages (bench/peers/node,
// package-lock.json) with npm ci into .cache/peers/node, starts a
// redis-server of its own on a free loopback port (no persistence; stopped
// by its PID at the end), and then, for each of -reps repetitions and under
// the machine's benchmark lock (-lock), runs every scenario for both
// libraries and both raw baselines, interleaved:
//
//   - store: DynamoDB, Redis;
//   - kind: new (every call a new key), dup (every call replays one of
//     -keys completed keys), cache (dup with each library's local cache on:
//     in-memory replay);
//   - 1 and 16 calls in flight.
//
// Each run reports ops/s, p50 and p99 latency, process CPU time per call
// (Go: getrusage; Node: process.cpuUsage), store requests per call counted
// on the client (Go: an SDK middleware and a go-redis hook; Node: an SDK
// middleware and a wrapper around the Redis client) and, on Redis, the
// commands and server CPU per call from INFO commandstats. The figures are
// medians over the repetitions; results go to bench/results/peers.json and
// peers.csv.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type options struct {
	reps, calls, keys int
	conc              []int
	only              string
	lock              string
	out               string
	root              string
	noNode            bool
}

func main() {
	var o options
	quick := flag.Bool("quick", false, "a quick run for development: 2 repetitions of 300 calls")
	flag.IntVar(&o.reps, "reps", 6, "repetitions; the figures are their medians")
	flag.IntVar(&o.calls, "calls", 2000, "calls per run")
	flag.IntVar(&o.keys, "keys", 200, "completed keys a duplicate or cache run replays")
	flag.StringVar(&o.only, "only", "", "run only the scenarios whose name contains this (e.g. redis/new)")
	flag.StringVar(&o.lock, "lock", "/tmp/idem-bench.lock", "file locked (flock) around each repetition, so measurements never overlap; empty: none")
	flag.StringVar(&o.out, "out", "", "results directory (default bench/results)")
	flag.BoolVar(&o.noNode, "no-node", false, "run the Go side only")
	report := flag.String("report", "", "measure nothing: print and write the tables again from this peers.json's samples")
	flag.Parse()
	if *report != "" {
		if err := rereport(*report, o.out); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			os.Exit(1)
		}
		return
	}
	if *quick {
		o.reps, o.calls = 2, 300
	}
	o.conc = []int{1, 16}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(o options) (err error) {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	o.root = root
	if o.out == "" {
		o.out = filepath.Join(root, "bench", "results")
	}
	endpoint := os.Getenv("IDEM_DYNAMODB_ENDPOINT")
	if endpoint == "" {
		return fmt.Errorf("IDEM_DYNAMODB_ENDPOINT is not set: run under scripts/dynamodb-local run (make bench-peers)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var nodeDir string
	if !o.noNode {
		if nodeDir, err = installNode(ctx, root); err != nil {
			return err
		}
	}
	rs, err := startRedis(ctx, filepath.Join(root, ".cache", "peers"))
	if err != nil {
		return err
	}
	defer func() {
		if e := rs.stop(); e != nil && err == nil {
			err = e
		}
	}()
	env, err := newEnv(ctx, endpoint, rs.addr)
	if err != nil {
		return err
	}
	defer env.close()

	var node *nodeSide
	if !o.noNode {
		if node, err = startNode(ctx, nodeDir, env); err != nil {
			return err
		}
		defer func() {
			if e := node.close(); e != nil && err == nil {
				err = e
			}
		}()
	}

	scenarios := allScenarios(o)
	if len(scenarios) == 0 {
		return fmt.Errorf("no scenario matches -only %q", o.only)
	}
	meta := collectMeta(ctx, root, env, nodeDir)
	fmt.Printf("peers: %d repetitions of %d calls, %d scenarios; %s\n", o.reps, o.calls, len(scenarios), meta.summary())

	var samples []sample
	start := time.Now()
	for rep := 0; rep <= o.reps; rep++ {
		// Repetition 0 is a short warm-up (JIT, connection pools), not kept.
		calls := o.calls
		if rep == 0 {
			calls = min(o.calls, 200)
		}
		err := withLock(o.lock, func() error {
			t0 := time.Now()
			for _, sc := range scenarios {
				for _, side := range sc.sides(node != nil) {
					if err := ctx.Err(); err != nil {
						return err
					}
					s, err := runOne(ctx, env, node, sc, side, calls, o.keys, fmt.Sprintf("%x-%d", start.UnixNano(), rep))
					if err != nil {
						return fmt.Errorf("%s %s: %w", sc.name(), side, err)
					}
					s.Rep = rep
					if rep > 0 {
						samples = append(samples, s)
					}
				}
			}
			if rep == 0 {
				fmt.Printf("warm-up done in %v\n", time.Since(t0).Round(time.Millisecond))
			} else {
				fmt.Printf("repetition %d/%d done in %v\n", rep, o.reps, time.Since(t0).Round(time.Millisecond))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	meta.Reps, meta.Calls, meta.Keys = o.reps, o.calls, o.keys
	meta.Seconds = time.Since(start).Seconds()
	rows := summarize(scenarios, samples)
	printTable(os.Stdout, rows)
	return writeResults(o.out, meta, rows, samples)
}

// rereport summarizes the samples of an earlier run again.
func rereport(file, out string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var r struct {
		Meta    meta     `json:"meta"`
		Samples []sample `json:"samples"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if out == "" {
		out = filepath.Dir(file)
	}
	rows := summarize(allScenarios(options{conc: []int{1, 16}}), r.Samples)
	printTable(os.Stdout, rows)
	return writeResults(out, r.Meta, rows, r.Samples)
}

// withLock runs f holding an exclusive flock on path (no lock if path is
// empty): the machine's benchmark lock, shared with every other
// measurement.
func withLock(path string, f func() error) error {
	if path == "" {
		return f()
	}
	fd, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return err
	}
	defer fd.Close()
	if err := syscall.Flock(int(fd.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	defer syscall.Flock(int(fd.Fd()), syscall.LOCK_UN)
	return f()
}

// repoRoot is the nearest directory up from the working directory that
// holds go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the working directory: run inside the repository")
		}
		dir = parent
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
