package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Reproduce (Redis 7 on loopback, no persistence: the machine's service):
//
//	cd store/redisstore && go test -run '^$' -bench . -benchmem -benchtime 2s -count 3
//
// Library and raw run side by side (…/library/c=N, …/raw/c=N), and each
// reports the server's cost per call besides ops/s and latency:
//
//   - srv-µs/op: INFO commandstats, the usec Redis spent executing the
//     commands the call sent, divided by calls. A script's usec includes
//     the commands it runs; those also appear under their own names, so a
//     name's usec counts only in the share of its calls the client sent
//     (counted by a hook).
//   - srv-cpu-µs/op: INFO cpu, the Redis process's CPU time (user + sys,
//     network I/O included) divided by calls. Other clients of the server
//     count in it too: run it alone.

// benchClient is the client both sides use; its hook counts the commands
// it sends, by name.
func benchClient(b *testing.B, opts ...func(*redis.Options)) (*redis.Client, *sent) {
	c := newClient(b, addr(b), append([]func(*redis.Options){func(o *redis.Options) { o.PoolSize = 32; o.ReadTimeout = 0; o.WriteTimeout = 0 }}, opts...)...)
	s := &sent{}
	c.AddHook(s)
	return c, s
}

func benchStore(b *testing.B) (*redisstore.Store, *redis.Client, *sent) {
	c, cnt := benchClient(b)
	s, err := redisstore.New(c, &redisstore.Config{Prefix: newPrefix(b, c)})
	if err != nil {
		b.Fatal(err)
	}
	return s, c, cnt
}

// sent counts commands by name, in pipelines too.
type sent struct{ m sync.Map } // name → *atomic.Int64

func (s *sent) add(name string) {
	v, ok := s.m.Load(name)
	if !ok {
		v, _ = s.m.LoadOrStore(name, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

func (s *sent) snapshot() map[string]int64 {
	out := map[string]int64{}
	s.m.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

func (s *sent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { s.add(cmd.Name()); return next(ctx, cmd) }
}
func (s *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.add(c.Name())
		}
		return next(ctx, cmds)
	}
}

// server is what INFO says about the server's work so far.
type server struct {
	calls, usec map[string]int64 // by command name, from commandstats
	cpu         float64          // seconds, used_cpu_user + used_cpu_sys
}

func readServer(b *testing.B, c *redis.Client) server {
	b.Helper()
	txt, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	s := server{calls: map[string]int64{}, usec: map[string]int64{}}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if name, rest, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, "cmdstat_") {
			name = strings.TrimPrefix(name, "cmdstat_")
			for f := range strings.SplitSeq(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					s.calls[name] = n
				case "usec":
					s.usec[name] = n
				}
			}
		} else if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(rest, 64)
			s.cpu += f
		}
	}
	return s
}

// measure runs run (which runs b.N calls) and reports the server's cost
// per call: srv-µs/op and srv-cpu-µs/op (see the file comment).
func measure(b *testing.B, c *redis.Client, cnt *sent, run func()) {
	usec, cpu := serverCost(b, c, cnt, run)
	b.ReportMetric(usec/float64(b.N), "srv-µs/op")
	b.ReportMetric(cpu/float64(b.N), "srv-cpu-µs/op")
}

// serverCost runs run and returns the server's usec (commandstats, over
// the commands the client sent) and CPU µs spent meanwhile.
func serverCost(b *testing.B, c *redis.Client, cnt *sent, run func()) (usec, cpu float64) {
	before, sentBefore := readServer(b, c), cnt.snapshot()
	run()
	after, sentAfter := readServer(b, c), cnt.snapshot()
	for name, n := range sentAfter {
		n -= sentBefore[name]
		calls := after.calls[name] - before.calls[name]
		if n <= 0 || calls <= 0 || name == "info" || name == "hello" {
			continue
		}
		share := min(1, float64(n)/float64(calls))
		usec += share * float64(after.usec[name]-before.usec[name])
	}
	return usec, (after.cpu - before.cpu) * 1e6
}

var conc = []int{1, 16}

func rawKey(p string, i int) string {
	k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
	return p + k.String()
}

var rawVal = []byte(`{"id":"r-1","amount":1000}`)

// BenchmarkNewCall: the library's new call (claim, run, complete) beside
// raw, the same client with no library: SET NX (the claim) and SET (the
// result). Keys and values are the library's sizes.
func BenchmarkNewCall(b *testing.B) {
	ctx := context.Background()
	for _, n := range conc {
		b.Run(fmt.Sprintf("library/c=%d", n), func(b *testing.B) {
			s, c, cnt := benchStore(b)
			e := benchkit.Engine(b, s)
			measure(b, c, cnt, func() { benchkit.NewCalls(b, e, n) })
		})
		b.Run(fmt.Sprintf("raw/c=%d", n), func(b *testing.B) {
			c, cnt := benchClient(b)
			p := newPrefix(b, c)
			measure(b, c, cnt, func() {
				benchkit.Run(b, n, func(i int) error {
					k := rawKey(p, i)
					ok, err := c.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
					if err != nil || !ok {
						return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
					}
					return c.Set(ctx, k, rawVal, 0).Err()
				})
			})
		})
	}
}

// BenchmarkDuplicateCall: a replay of a completed key beside raw: the SET
// NX failing and a GET of the stored value — what a hand-written check
// needs to answer a duplicate.
func BenchmarkDuplicateCall(b *testing.B) {
	ctx := context.Background()
	const keys = 1000
	for _, n := range conc {
		b.Run(fmt.Sprintf("library/c=%d", n), func(b *testing.B) {
			s, c, cnt := benchStore(b)
			e := benchkit.Engine(b, s)
			do := func(i int) (idem.Result[benchkit.Receipt], error) {
				return idem.Do(ctx, e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, func(context.Context) (benchkit.Receipt, error) {
					return benchkit.Receipt{ID: "r-1", Amount: 1000}, nil
				})
			}
			for i := range keys {
				if _, err := do(i); err != nil {
					b.Fatal(err)
				}
			}
			measure(b, c, cnt, func() {
				benchkit.Run(b, n, func(i int) error {
					r, err := do(i % keys)
					if err == nil && !r.Replayed {
						err = fmt.Errorf("call %d was not a replay", i)
					}
					return err
				})
			})
		})
		b.Run(fmt.Sprintf("raw/c=%d", n), func(b *testing.B) {
			c, cnt := benchClient(b)
			p := newPrefix(b, c)
			for i := range keys {
				c.Set(ctx, rawKey(p, i), rawVal, 0)
			}
			measure(b, c, cnt, func() {
				benchkit.Run(b, n, func(i int) error {
					k := rawKey(p, i%keys)
					ok, err := c.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
					if err != nil || ok {
						return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
					}
					return c.Get(ctx, k).Err()
				})
			})
		})
	}
}

// BenchmarkNewCallAutoPipeline: the same at 16 in flight through go-redis's
// AutoPipeliner (client.AutoPipeline(), a UniversalClient): concurrent
// commands share pipelines, for the library (the store given the
// autopipeliner) and for raw.
func BenchmarkNewCallAutoPipeline(b *testing.B) {
	ctx := context.Background()
	const n = 16
	auto := func(b *testing.B, c *redis.Client) *redis.AutoPipeliner {
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ap.Close() })
		return ap
	}
	b.Run(fmt.Sprintf("library/c=%d", n), func(b *testing.B) {
		c, cnt := benchClient(b)
		s, err := redisstore.New(auto(b, c), &redisstore.Config{Prefix: newPrefix(b, c)})
		if err != nil {
			b.Fatal(err)
		}
		e := benchkit.Engine(b, s)
		measure(b, c, cnt, func() { benchkit.NewCalls(b, e, n) })
	})
	b.Run(fmt.Sprintf("raw/c=%d", n), func(b *testing.B) {
		c, cnt := benchClient(b)
		p := newPrefix(b, c)
		ap := auto(b, c)
		measure(b, c, cnt, func() {
			benchkit.Run(b, n, func(i int) error {
				k := rawKey(p, i)
				ok, err := ap.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
				if err != nil || !ok {
					return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
				}
				return ap.Set(ctx, k, rawVal, 0).Err()
			})
		})
	})
}

// BenchmarkNewCallInterleaved runs library and raw new calls in turns of
// 500 calls each, so that both see the same load on a shared machine, and
// reports each side's ops/s and server cost and their ratio (lib/raw).
// The figures docs/benchmarks.md compares.
func BenchmarkNewCallInterleaved(b *testing.B) {
	ctx := context.Background()
	for _, n := range conc {
		b.Run(fmt.Sprintf("c=%d", n), func(b *testing.B) {
			s, lc, lcnt := benchStore(b)
			e := benchkit.Engine(b, s)
			rc, rcnt := benchClient(b)
			p := newPrefix(b, rc)
			lib := func(i int) error {
				_, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, func(context.Context) (benchkit.Receipt, error) {
					return benchkit.Receipt{ID: "r-1", Amount: 1000}, nil
				})
				return err
			}
			raw := func(i int) error {
				k := rawKey(p, i)
				ok, err := rc.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
				if err != nil || !ok {
					return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
				}
				return rc.Set(ctx, k, rawVal, 0).Err()
			}
			var t [2]time.Duration
			var usec, cpu [2]float64
			b.ResetTimer()
			for from := 0; from < b.N; from += 500 {
				to := min(from+500, b.N)
				for side, op := range []func(int) error{lib, raw} {
					c, cnt := lc, lcnt
					if side == 1 {
						c, cnt = rc, rcnt
					}
					u, cp := serverCost(b, c, cnt, func() {
						t0 := time.Now()
						runRange(b, n, from, to, op)
						t[side] += time.Since(t0)
					})
					usec[side] += u
					cpu[side] += cp
				}
			}
			b.StopTimer()
			libOps, rawOps := float64(b.N)/t[0].Seconds(), float64(b.N)/t[1].Seconds()
			b.ReportMetric(libOps, "lib-ops/s")
			b.ReportMetric(rawOps, "raw-ops/s")
			b.ReportMetric(libOps/rawOps, "lib/raw")
			b.ReportMetric(usec[0]/float64(b.N), "lib-srv-µs/op")
			b.ReportMetric(usec[1]/float64(b.N), "raw-srv-µs/op")
			b.ReportMetric(cpu[0]/float64(b.N), "lib-srv-cpu-µs/op")
			b.ReportMetric(cpu[1]/float64(b.N), "raw-srv-cpu-µs/op")
		})
	}
}

// runRange calls op(i) for i in [from, to) from conc goroutines.
func runRange(b *testing.B, conc, from, to int, op func(int) error) {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var failed atomic.Value
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= to {
					return
				}
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}
