package idem_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// The engine's overhead over memstore, against calling the bare function.
// Reproduce: go test -run '^$' -bench . -benchmem -count 5 .
//
// Besides time per call, each benchmark reports cpu-ns/op: the CPU time the
// process used per call (garbage collector included), which a machine
// shared with other work inflates far less than the time.

// cpuPerOp starts counting CPU time; call the function it returns when
// the loop is done.
func cpuPerOp(b *testing.B) func() {
	start := cpuNow()
	return func() { b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op") }
}

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func chargeFn(context.Context) (receipt, error) { return receipt{ID: "r-1", Amount: 1000}, nil }

func benchEngine(b *testing.B, cfg *idem.Config) (*idem.Engine, *faultstore.Store) {
	b.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1, MaxRecords: 1 << 30})
	b.Cleanup(func() { _ = mem.Close() })
	fs := faultstore.New(mem)
	if cfg == nil {
		cfg = &idem.Config{}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := idem.New(fs, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return e, fs
}

func BenchmarkBare(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if _, err := chargeFn(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewCall(b *testing.B) {
	e, _ := benchEngine(b, nil)
	ctx := context.Background()
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
	}
	round, op := 0, "charge0"
	b.ReportAllocs()
	defer cpuPerOp(b)()
	i := 0
	for b.Loop() {
		if i == len(keys) { // new scope per round keeps every key new
			i, round = 0, round+1
			op = "charge" + strconv.Itoa(round)
		}
		req := idem.Request{Operation: op, Key: keys[i]}
		i++
		if _, err := idem.Do(ctx, e, req, chargeFn); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	e, _ := benchEngine(b, nil)
	ctx := context.Background()
	req := idem.Request{Operation: "charge", Key: "order-1"}
	if _, err := idem.Do(ctx, e, req, chargeFn); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if r, err := idem.Do(ctx, e, req, chargeFn); err != nil || !r.Replayed {
			b.Fatal(r, err)
		}
	}
}

func BenchmarkCacheHit(b *testing.B) {
	e, fs := benchEngine(b, &idem.Config{CacheEntries: 10_000})
	ctx := context.Background()
	req := idem.Request{Operation: "charge", Key: "order-1"}
	if _, err := idem.Do(ctx, e, req, chargeFn); err != nil {
		b.Fatal(err)
	}
	before := fs.Total()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if r, err := idem.Do(ctx, e, req, chargeFn); err != nil || !r.Replayed {
			b.Fatal(r, err)
		}
	}
	b.ReportMetric(float64(fs.Total()-before)/float64(b.N), "storecalls/op")
}

// Concurrent duplicates: all goroutines call with keys that change every
// 64 calls, so most calls are duplicates of a call in flight or just done.
func BenchmarkConcurrentDuplicates(b *testing.B) {
	e, fs := benchEngine(b, &idem.Config{})
	ctx := context.Background()
	var seq atomic.Int64
	var runs atomic.Int64
	fn := func(context.Context) (receipt, error) { runs.Add(1); return receipt{ID: "r"}, nil }
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := seq.Add(1) / 64
			_, _ = idem.Do(ctx, e, idem.Request{Operation: "dup", Key: strconv.FormatInt(n, 10)}, fn)
		}
	})
	b.ReportMetric(float64(runs.Load())/float64(b.N), "executions/op")
	b.ReportMetric(float64(fs.Calls("claim"))/float64(b.N), "claims/op")
}

// NewCall over a store that does not grow: 4,096 keys, each claimed anew
// once the clock has passed its expiry (memstore overwrites an expired
// record in place), so the figure is the engine's and the store's per-call
// work without the cost of an ever larger map to hash into and scan.
func BenchmarkNewCallSteady(b *testing.B) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	e, fs := benchEngine(b, &idem.Config{Clock: clock, Expiry: time.Minute, Lease: time.Second})
	ctx := context.Background()
	keys := make([]string, 1<<12)
	for i := range keys {
		keys[i] = "order-" + strconv.Itoa(i)
	}
	i := 0
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if i == len(keys) { // every key has expired when it comes round again
			i = 0
			clock.Advance(2 * time.Minute)
		}
		r, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: keys[i]}, chargeFn)
		if err != nil || r.Replayed {
			b.Fatal(r, err)
		}
		i++
	}
	b.ReportMetric(float64(fs.Calls("claim"))/float64(b.N), "claims/op")
}

// Replay of a raw JSON result (JSONCodec stores it as it is): no reflection on either side.
func BenchmarkReplayRaw(b *testing.B) {
	e, _ := benchEngine(b, &idem.Config{})
	ctx := context.Background()
	req := idem.Request{Operation: "charge", Key: "order-1"}
	raw := func(context.Context) (json.RawMessage, error) {
		return json.RawMessage(`{"id":"r-1","amount":1000}`), nil
	}
	if _, err := idem.Do(ctx, e, req, raw); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if r, err := idem.Do(ctx, e, req, raw); err != nil || !r.Replayed || len(r.Value) == 0 {
			b.Fatal(r, err)
		}
	}
}

// The store's share of NewCallSteady: the same memstore claims and
// completes, by hand, with keys, owners and results made beforehand — what
// a new call costs with no engine.
func BenchmarkMemstoreRaw(b *testing.B) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1, MaxRecords: 1 << 30})
	b.Cleanup(func() { _ = mem.Close() })
	ctx := context.Background()
	keys := make([]string, 1<<12)
	for i := range keys {
		id, err := (&idem.Request{Operation: "charge", Key: "order-" + strconv.Itoa(i)}).Identity()
		if err != nil {
			b.Fatal(err)
		}
		keys[i] = id.StoreKey.String()
	}
	result := []byte(`{"id":"r-1","amount":1000}`)
	now := time.Now().UnixMilli()
	i := 0
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		if i == len(keys) {
			i, now = 0, now+2*time.Minute.Milliseconds()
		}
		p := store.ClaimParams{Key: keys[i], Owner: "owner/1", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + time.Minute.Milliseconds(), Local: true}
		res, err := mem.Claim(ctx, p)
		if err != nil || !res.Acquired {
			b.Fatal(res, err)
		}
		if err := mem.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: keys[i], Fence: res.Record.Fence, Owner: "owner/1", Now: now}, ExpiresAt: p.ExpiresAt, Result: result}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// The batch machinery against the single path, per item, over memstore
// (which claims in batches) with 4,096 keys claimed anew once expired, as
// NewCallSteady: 16 new keys at a time, as a consumer holds 16 messages in
// flight — DoBatch with all 16 at once (on batch workers from WithBatchWorkers, as a consumer
// loop holds one, and without), and 16 goroutines each calling
// DoIdentity. ns/op, cpu-ns/op and allocs are per item.
func BenchmarkBatch16(b *testing.B) {
	const size = 16
	run := func(b *testing.B, do func(ctx context.Context, e *idem.Engine, ids []idem.Identity)) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1, MaxRecords: 1 << 30})
		b.Cleanup(func() { _ = mem.Close() })
		clock := clocktest.New(time.Unix(1_700_000_000, 0))
		e, err := idem.New(mem, &idem.Config{Clock: clock, Expiry: time.Minute, Lease: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		ids := make([]idem.Identity, 1<<12)
		for i := range ids {
			if ids[i], err = (&idem.Request{Operation: "charge", Key: "order-" + strconv.Itoa(i)}).Identity(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		defer cpuPerOp(b)()
		for i := 0; i < b.N; i += size {
			j := i % len(ids)
			if j == 0 { // every key has expired when it comes round again
				clock.Advance(2 * time.Minute)
			}
			do(ctx, e, ids[j:j+size])
		}
	}
	fn := func(context.Context, int) (receipt, error) { return receipt{ID: "r-1", Amount: 1000}, nil }
	b.Run("single", func(b *testing.B) {
		run(b, func(ctx context.Context, e *idem.Engine, ids []idem.Identity) {
			var wg sync.WaitGroup
			for j := range ids {
				wg.Go(func() {
					if r, err := idem.DoIdentity(ctx, e, ids[j], chargeFn); err != nil || r.Replayed {
						b.Error(r, err)
					}
				})
			}
			wg.Wait()
		})
	})
	b.Run("batch", func(b *testing.B) {
		run(b, func(ctx context.Context, e *idem.Engine, ids []idem.Identity) {
			if rs, errs := idem.DoBatch(ctx, e, ids, nil, fn); errs[0] != nil || rs[0].Replayed {
				b.Error(rs[0], errs[0])
			}
		})
	})
	b.Run("runner", func(b *testing.B) {
		wctx, stop := idem.WithBatchWorkers(context.Background())
		defer stop()
		run(b, func(ctx context.Context, e *idem.Engine, ids []idem.Identity) {
			if rs, errs := idem.DoBatch(wctx, e, ids, nil, fn); errs[0] != nil || rs[0].Replayed {
				b.Error(rs[0], errs[0])
			}
		})
	})
}
