package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Reproduce (a redis-server of the benchmark's own, so that its INFO cpu
// counts nothing else):
//
//	cd store/redisstore && go test -run '^$' -bench BatchRedisCPU -benchtime 20000x -count 3
//
// BenchmarkBatchRedisCPU sets the store's batch path (ClaimBatch of n new
// keys, then CompleteBatch of them) beside a hand-written pipelined SET NX
// + SET per message (a pipeline of n SET NX, then one of n SET), and its
// two halves apart at n = 16 (ClaimBatch beside the SET NX pipeline,
// CompleteBatch of keys claimed before the turn beside the SET pipeline);
// duplicates (ClaimBatch of n completed keys) beside a pipeline of n SET
// NX GET; and the single path (Claim + Complete, Claim of a completed
// key, at 16 in flight) beside SET NX + SET and SET NX GET at 16 in
// flight. The two sides of a row run in turns of 1,024 messages on the
// same server, so that both see the same load, and each reports its
// msgs/s and the Redis CPU per message (used_cpu_user + used_cpu_sys of
// INFO cpu, before and after each turn, through benchkit.RedisCPU); ratio
// is the store's Redis CPU per message ÷ the hand-written one's.
func BenchmarkBatchRedisCPU(b *testing.B) {
	a := redisnodes.Start(b)
	c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 32})
	b.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, &redisstore.Config{Prefix: "idem:"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := 0 // each b.Run's keys are its own
	keys := func() (lib, raw func(i int) string) {
		run++
		lp, rp := fmt.Sprintf("l%d:", run), fmt.Sprintf("idem:r%d:", run)
		return func(i int) string { return rawKey(lp, i) }, func(i int) string { return rawKey(rp, i) }
	}
	b.Cleanup(func() { c.FlushAll(ctx) })

	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("new/batch/n=%d", n), func(b *testing.B) {
			lk, rk := keys()
			sides(b, a, inBatches(n, func(from, to int) error { return claimComplete(ctx, s, lk, from, to) }),
				inBatches(n, func(from, to int) error { return setNXSet(ctx, c, rk, from, to) }))
		})
	}
	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("dup/batch/n=%d", n), func(b *testing.B) {
			lk, rk := keys()
			completed(b, ctx, s, c, lk, rk)
			sides(b, a, func(from, to int) error {
				for i := from; i < to; i += n {
					ps := make([]store.ClaimParams, 0, n)
					for j := i; j < min(i+n, to); j++ {
						ps = append(ps, claimParams(lk(j%dupKeys), j))
					}
					res, errs := s.ClaimBatch(ctx, ps)
					for j := range ps {
						if errs[j] != nil || res[j].Acquired || res[j].Record.Status != store.StatusCompleted {
							return fmt.Errorf("duplicate claim %s: %+v %v", ps[j].Key, res[j], errs[j])
						}
					}
				}
				return nil
			}, func(from, to int) error {
				for i := from; i < to; i += n {
					p := c.Pipeline()
					cmds := make([]*redis.StatusCmd, 0, n)
					for j := i; j < min(i+n, to); j++ {
						cmds = append(cmds, p.SetArgs(ctx, rk(j%dupKeys), "IN_PROGRESS", redis.SetArgs{Mode: "NX", Get: true}))
					}
					if _, err := p.Exec(ctx); err != nil {
						return err
					}
					for _, cmd := range cmds {
						if v, err := cmd.Result(); err != nil || v == "" {
							return fmt.Errorf("SET NX GET of a completed key: %q %v", v, err)
						}
					}
				}
				return nil
			})
		})
	}
	// The two halves of new/batch/n=16 apart: the claims alone (against
	// the SET NX alone), and the Completes of keys claimed before the
	// turn (against the SET alone).
	const half = 16
	b.Run(fmt.Sprintf("claim/batch/n=%d", half), func(b *testing.B) {
		lk, rk := keys()
		sides(b, a, inBatches(half, func(from, to int) error { _, err := claimBatch(ctx, s, lk, from, to); return err }),
			inBatches(half, func(from, to int) error { return setNX(ctx, c, rk, from, to) }))
	})
	b.Run(fmt.Sprintf("complete/batch/n=%d", half), func(b *testing.B) {
		lk, rk := keys()
		cs := make([]store.CompleteParams, 0, b.N)
		for i := 0; i < b.N; i += half {
			claimed, err := claimBatch(ctx, s, lk, i, min(i+half, b.N))
			if err != nil {
				b.Fatal(err)
			}
			cs = append(cs, claimed...)
			if err := setNX(ctx, c, rk, i, min(i+half, b.N)); err != nil {
				b.Fatal(err)
			}
		}
		sides(b, a, func(from, to int) error {
			for i := from; i < to; i += half {
				for j, err := range s.CompleteBatch(ctx, cs[i:min(i+half, to)]) {
					if err != nil {
						return fmt.Errorf("complete %s: %v", cs[i+j].Key, err)
					}
				}
			}
			return nil
		}, func(from, to int) error {
			for i := from; i < to; i += half {
				p := c.Pipeline()
				for j := i; j < min(i+half, to); j++ {
					p.Set(ctx, rk(j), rawVal, 0)
				}
				if _, err := p.Exec(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	})
	const inFlight = 16
	b.Run(fmt.Sprintf("new/single/c=%d", inFlight), func(b *testing.B) {
		lk, rk := keys()
		sides(b, a, func(from, to int) error {
			runRange(b, inFlight, from, to, func(i int) error { return claimComplete(ctx, s, lk, i, i+1) })
			return nil
		}, func(from, to int) error {
			runRange(b, inFlight, from, to, func(i int) error {
				k := rk(i)
				if ok, err := c.SetNX(ctx, k, "IN_PROGRESS", 0).Result(); err != nil || !ok {
					return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
				}
				return c.Set(ctx, k, rawVal, 0).Err()
			})
			return nil
		})
	})
	b.Run(fmt.Sprintf("dup/single/c=%d", inFlight), func(b *testing.B) {
		lk, rk := keys()
		completed(b, ctx, s, c, lk, rk)
		sides(b, a, func(from, to int) error {
			runRange(b, inFlight, from, to, func(i int) error {
				res, err := s.Claim(ctx, claimParams(lk(i%dupKeys), i))
				if err != nil || res.Acquired {
					return fmt.Errorf("duplicate claim: %+v %v", res, err)
				}
				return nil
			})
			return nil
		}, func(from, to int) error {
			runRange(b, inFlight, from, to, func(i int) error {
				v, err := c.SetArgs(ctx, rk(i%dupKeys), "IN_PROGRESS", redis.SetArgs{Mode: "NX", Get: true}).Result()
				if err != nil || v == "" {
					return fmt.Errorf("SET NX GET of a completed key: %q %v", v, err)
				}
				return nil
			})
			return nil
		})
	})
}

// dupKeys is how many completed keys the duplicate rows claim in turn.
const dupKeys = 1024

const benchOwner = "bench-host-4242-0000000000000001"

var benchFingerprint = fmt.Sprintf("%064x", 42)

func claimParams(key string, i int) store.ClaimParams {
	now := time.Now().UnixMilli()
	return store.ClaimParams{Key: key, Fingerprint: benchFingerprint, Owner: benchOwner + strconv.Itoa(i),
		Now: now, LeaseUntil: now + 30_000, ExpiresAt: now + 3_600_000}
}

// claimBatch claims the keys key(from) … key(to-1) in one ClaimBatch and
// returns the Completes of their claims.
func claimBatch(ctx context.Context, s *redisstore.Store, key func(int) string, from, to int) ([]store.CompleteParams, error) {
	ps := make([]store.ClaimParams, 0, to-from)
	for i := from; i < to; i++ {
		ps = append(ps, claimParams(key(i), i))
	}
	res, errs := s.ClaimBatch(ctx, ps)
	cs := make([]store.CompleteParams, len(ps))
	for j, p := range ps {
		if errs[j] != nil || !res[j].Acquired {
			return nil, fmt.Errorf("claim %s: %+v %v", p.Key, res[j], errs[j])
		}
		cs[j] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: res[j].Record.Fence, Owner: p.Owner, Now: p.Now},
			ExpiresAt: p.ExpiresAt, Result: rawVal}
	}
	return cs, nil
}

// claimComplete claims the keys key(from) … key(to-1) in one ClaimBatch
// and completes them in one CompleteBatch.
func claimComplete(ctx context.Context, s *redisstore.Store, key func(int) string, from, to int) error {
	cs, err := claimBatch(ctx, s, key, from, to)
	if err != nil {
		return err
	}
	for j, err := range s.CompleteBatch(ctx, cs) {
		if err != nil {
			return fmt.Errorf("complete %s: %v", cs[j].Key, err)
		}
	}
	return nil
}

// setNX is the hand-written claim: a pipeline of SET NX, one per key.
func setNX(ctx context.Context, c *redis.Client, key func(int) string, from, to int) error {
	p := c.Pipeline()
	nx := make([]*redis.BoolCmd, 0, to-from)
	for i := from; i < to; i++ {
		nx = append(nx, p.SetNX(ctx, key(i), "IN_PROGRESS", 0))
	}
	if _, err := p.Exec(ctx); err != nil {
		return err
	}
	for _, cmd := range nx {
		if !cmd.Val() {
			return fmt.Errorf("SET NX of a new key refused")
		}
	}
	return nil
}

// setNXSet is the hand-written baseline: a pipeline of SET NX, one per
// key, then a pipeline of SET.
func setNXSet(ctx context.Context, c *redis.Client, key func(int) string, from, to int) error {
	if err := setNX(ctx, c, key, from, to); err != nil {
		return err
	}
	p := c.Pipeline()
	for i := from; i < to; i++ {
		p.Set(ctx, key(i), rawVal, 0)
	}
	_, err := p.Exec(ctx)
	return err
}

// completed stores dupKeys completed records for the store (lib) and as
// many plain values for the baseline (raw).
func completed(b *testing.B, ctx context.Context, s *redisstore.Store, c *redis.Client, lib, raw func(int) string) {
	b.Helper()
	for i := 0; i < dupKeys; i += 64 {
		if err := claimComplete(ctx, s, lib, i, i+64); err != nil {
			b.Fatal(err)
		}
		p := c.Pipeline()
		for j := i; j < i+64; j++ {
			p.Set(ctx, raw(j), rawVal, 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// inBatches returns a side of a row that calls f on [from, to) in
// batches of n.
func inBatches(n int, f func(from, to int) error) func(from, to int) error {
	return func(from, to int) error {
		for i := from; i < to; i += n {
			if err := f(i, min(i+n, to)); err != nil {
				return err
			}
		}
		return nil
	}
}

// sides runs lib and raw over b.N messages each, in turns of 1,024, and
// reports each side's msgs/s and Redis CPU µs per message, read from the
// server at addr before and after each turn, and their ratio.
func sides(b *testing.B, addr string, lib, raw func(from, to int) error) {
	const turn = 1024
	var t [2]time.Duration
	var cpu [2]time.Duration
	b.ResetTimer()
	for from := 0; from < b.N; from += turn {
		to := min(from+turn, b.N)
		for side, f := range [2]func(int, int) error{lib, raw} {
			c0, err := benchkit.RedisCPU(addr)
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if err := f(from, to); err != nil {
				b.Fatal(err)
			}
			t[side] += time.Since(t0)
			c1, err := benchkit.RedisCPU(addr)
			if err != nil {
				b.Fatal(err)
			}
			cpu[side] += c1 - c0
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(n/t[0].Seconds(), "msgs/s")
	b.ReportMetric(n/t[1].Seconds(), "raw-msgs/s")
	b.ReportMetric(float64(cpu[0].Microseconds())/n, "redis-cpu-µs/msg")
	b.ReportMetric(float64(cpu[1].Microseconds())/n, "raw-redis-cpu-µs/msg")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "ratio")
	b.ReportMetric(0, "ns/op")
}
