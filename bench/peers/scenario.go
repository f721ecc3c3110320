package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"
)

// A scenario is one store, kind of call and number of calls in flight.
type scenario struct {
	Store string // "dynamodb", "redis"
	Kind  string // "new", "dup", "cache"
	Conc  int
}

func (s scenario) name() string { return fmt.Sprintf("%s/%s/c=%d", s.Store, s.Kind, s.Conc) }

// The sides measured in each scenario: the two libraries and, except for
// the local cache (which has no store call to compare with), each one's
// raw client doing the same writes by hand.
const (
	sideIdem       = "idem"
	sideGoRaw      = "go-raw"
	sidePowertools = "powertools"
	sideNodeRaw    = "node-raw"
)

func (s scenario) sides(node bool) []string {
	out := []string{sideIdem, sideGoRaw}
	if node {
		out = append(out, sidePowertools, sideNodeRaw)
	}
	if s.Kind == "cache" {
		out = slices.DeleteFunc(out, func(side string) bool { return strings.HasSuffix(side, "-raw") })
	}
	return out
}

func allScenarios(o options) []scenario {
	var out []scenario
	for _, st := range []string{"dynamodb", "redis"} {
		for _, k := range []string{"new", "dup", "cache"} {
			for _, c := range o.conc {
				s := scenario{Store: st, Kind: k, Conc: c}
				if o.only == "" || strings.Contains(s.name(), o.only) {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// A sample is one run of one side in one scenario.
type sample struct {
	Scenario string  `json:"scenario"`
	Side     string  `json:"side"`
	Rep      int     `json:"rep"`
	Calls    int     `json:"calls"`
	Seconds  float64 `json:"seconds"`
	OpsPerS  float64 `json:"ops_per_s"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	CPUus    float64 `json:"cpu_us_per_call"`
	Requests float64 `json:"requests_per_call"`
	// Redis only: commands per call (INFO commandstats; those a script runs
	// count too) and the server's CPU time per call (INFO cpu).
	ServerCmds float64 `json:"server_commands_per_call,omitempty"`
	ServerUs   float64 `json:"server_us_per_call,omitempty"`
}

// measured is what a side reports for one run.
type measured struct {
	calls    int
	seconds  float64
	p50, p99 float64 // µs
	cpu      float64 // µs, whole run
	requests int64   // whole run
}

func runOne(ctx context.Context, env *env, node *nodeSide, sc scenario, side string, calls, keys int, tag string) (sample, error) {
	tag = fmt.Sprintf("%s-%s-%s-%s-%d", tag, side, sc.Store, sc.Kind, sc.Conc)
	var m measured
	var before, after serverStats
	var err error
	// ready resets the Redis server's statistics after the setup (the keys a
	// duplicate replays), just before the measured calls.
	ready := func() (err error) {
		if sc.Store == "redis" {
			before, err = env.resetStats(ctx)
		}
		return err
	}
	switch side {
	case sideIdem, sideGoRaw:
		m, err = env.runGo(ctx, sc, side == sideGoRaw, calls, keys, tag, ready)
	case sidePowertools, sideNodeRaw:
		lib := "powertools"
		if side == sideNodeRaw {
			lib = "raw"
		}
		req := nodeRequest{Lib: lib, Store: sc.Store, Kind: sc.Kind, Conc: sc.Conc, Calls: calls, Keys: keys, Tag: tag, Setup: true}
		if _, err = node.run(req); err == nil {
			if err = ready(); err == nil {
				req.Setup = false
				m, err = node.run(req)
			}
		}
	default:
		err = fmt.Errorf("unknown side %q", side)
	}
	if err == nil && sc.Store == "redis" {
		after, err = env.serverStats(ctx)
	}
	if err != nil {
		return sample{}, err
	}
	n := float64(m.calls)
	s := sample{
		Scenario: sc.name(), Side: side, Calls: m.calls, Seconds: m.seconds,
		OpsPerS: n / m.seconds, P50us: m.p50, P99us: m.p99,
		CPUus: m.cpu / n, Requests: float64(m.requests) / n,
	}
	if sc.Store == "redis" {
		s.ServerCmds = float64(after.calls) / n
		s.ServerUs = float64(after.cpuUs-before.cpuUs) / n
	}
	return s, nil
}

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// percentile of sorted latencies, in µs.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))]) / 1e3
}
