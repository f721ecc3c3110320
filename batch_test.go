package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func ids(t *testing.T, keys ...string) []idem.Identity {
	t.Helper()
	out := make([]idem.Identity, len(keys))
	for i, k := range keys {
		r := req(k)
		id, err := r.Identity()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = id
	}
	return out
}

// A batch is claimed in one store call; each new key runs once, a settled
// key replays, a key held elsewhere is in progress, and a key named twice
// runs once.
func TestDoBatchClaimsInOneCall(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	other := en.another(t, idem.Config{})
	ctx := context.Background()
	if _, err := idem.Do(ctx, en.eng, req("done"), func(context.Context) (string, error) { return "earlier", nil }); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	release := make(chan struct{})
	go func() {
		_, _ = idem.Do(ctx, other, req("held"), func(context.Context) (string, error) { close(held); <-release; return "x", nil })
	}()
	<-held
	defer close(release)
	claimsBefore := en.store.Calls("claim")

	var runs [6]atomic.Int32
	batch := ids(t, "a", "b", "done", "held", "a", "c")
	res, errs := idem.DoBatch(ctx, en.eng, batch, nil, func(ctx context.Context, i int) (string, error) {
		runs[i].Add(1)
		if c, ok := idem.FromContext(ctx); !ok || c.Key != batch[i].StoreKey.String() {
			t.Errorf("record %d runs without its claim: %+v", i, c)
		}
		return fmt.Sprintf("v%d", i), nil
	})
	if n := en.store.Calls("claim_batch"); n != 1 {
		t.Errorf("%d batch claims, want 1", n)
	}
	if n := en.store.Calls("claim") - claimsBefore; n != 0 {
		t.Errorf("%d single claims besides the batch", n)
	}
	for _, i := range []int{0, 1, 5} {
		if errs[i] != nil || res[i].Replayed || res[i].Value != fmt.Sprintf("v%d", i) || runs[i].Load() != 1 || res[i].Recorded != store.StatusCompleted {
			t.Errorf("new key %d: %+v %v, ran %d times", i, res[i], errs[i], runs[i].Load())
		}
	}
	if errs[2] != nil || !res[2].Replayed || res[2].Value != "earlier" || runs[2].Load() != 0 {
		t.Errorf("settled key: %+v %v, ran %d times", res[2], errs[2], runs[2].Load())
	}
	if !errors.Is(errs[3], idem.ErrInProgress) || runs[3].Load() != 0 {
		t.Errorf("held key: %+v %v, ran %d times", res[3], errs[3], runs[3].Load())
	}
	if runs[4].Load() != 0 || !(errors.Is(errs[4], idem.ErrInProgress) || res[4].Replayed && res[4].Value == "v0") {
		t.Errorf("second of a key named twice: %+v %v, ran %d times", res[4], errs[4], runs[4].Load())
	}
	for i, r := range res {
		if r.StoreKey != batch[i].StoreKey.String() {
			t.Errorf("result %d: store key %q, want %q", i, r.StoreKey, batch[i].StoreKey.String())
		}
	}
	// Replayed now, from the store.
	res, errs = idem.DoBatch(ctx, en.eng, ids(t, "a", "b"), &idem.BatchOptions[string]{Concurrency: 1}, func(context.Context, int) (string, error) {
		t.Error("a settled key ran again")
		return "", nil
	})
	if errs[0] != nil || errs[1] != nil || res[0].Value != "v0" || res[1].Value != "v1" || !res[0].Replayed {
		t.Errorf("replayed batch: %+v %v", res, errs)
	}
}

// A batch claim that fails fails every record with the claim's StoreError,
// and runs nothing.
func TestDoBatchClaimFailure(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	boom := errors.New("connection reset")
	en.store.FailAlways("claim_batch", boom)
	_, errs := idem.DoBatch(context.Background(), en.eng, ids(t, "a", "b", "c"), nil, func(context.Context, int) (int, error) {
		t.Error("ran without a claim")
		return 0, nil
	})
	for i, err := range errs {
		var se *idem.StoreError
		if !errors.As(err, &se) || se.Op != observe.StoreClaim || !errors.Is(err, boom) {
			t.Errorf("record %d: %v, want the claim's StoreError", i, err)
		}
	}
	if n := en.store.Calls("claim"); n != 0 {
		t.Errorf("%d single claims after the batch failed", n)
	}
}

// Records that fail keep DoIdentity's rules: a terminal error is stored,
// any other error releases the key, and a panic-free batch leaves nothing
// claimed.
func TestDoBatchOutcomes(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	_, errs := idem.DoBatch(ctx, en.eng, ids(t, "ok", "term", "retry"), &idem.BatchOptions[int]{Concurrency: 1}, func(_ context.Context, i int) (int, error) {
		switch i {
		case 1:
			return 0, &idem.TerminalError{Code: "card_declined", Message: "declined"}
		case 2:
			return 0, errors.New("timeout")
		}
		return 7, nil
	})
	var te *idem.TerminalError
	if errs[0] != nil || !errors.As(errs[1], &te) || errs[2] == nil {
		t.Fatalf("outcomes: %v", errs)
	}
	ran := 0
	res, errs := idem.DoBatch(ctx, en.eng, ids(t, "ok", "term", "retry"), nil, func(context.Context, int) (int, error) { ran++; return 8, nil })
	if res[0].Value != 7 || !errors.As(errs[1], &te) || te.Code != "card_declined" || errs[2] != nil || res[2].Value != 8 || ran != 1 {
		t.Fatalf("after: %+v %v (ran %d)", res, errs, ran)
	}
}

// Batches racing single calls and each other over the same keys: every
// key runs exactly once.
func TestDoBatchRacesRunEachKeyOnce(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Wait: 0})
	other := en.another(t, idem.Config{})
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	run := func(k string) {
		mu.Lock()
		runs[k]++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			batch := make([]string, 0, len(keys))
			for i := range keys {
				batch = append(batch, keys[(i+g)%len(keys)])
			}
			e := en.eng
			if g%2 == 1 {
				e = other
			}
			_, _ = idem.DoBatch(ctx, e, ids(t, batch...), &idem.BatchOptions[int]{Concurrency: 3}, func(_ context.Context, i int) (int, error) { run(batch[i]); return i, nil })
		})
		wg.Go(func() {
			_, _ = idem.Do(ctx, en.eng, req(keys[g]), func(context.Context) (int, error) { run(keys[g]); return 0, nil })
		})
	}
	wg.Wait()
	for _, k := range keys {
		if runs[k] > 1 {
			t.Errorf("key %s ran %d times", k, runs[k])
		}
	}
	// Every key is settled: a last batch replays all of them.
	_, errs := idem.DoBatch(ctx, en.eng, ids(t, keys...), nil, func(_ context.Context, i int) (int, error) { run(keys[i]); return 0, nil })
	for _, k := range keys {
		if runs[k] != 1 {
			t.Errorf("key %s ran %d times in all", k, runs[k])
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("final batch, key %s: %v", keys[i], err)
		}
	}
}

// TestDoBatchLandsFlightsItDidNotAcquire: a key of a batch held by another
// engine does not wait for a slot of concurrency behind the batch's
// running operations before its flight lands: once the other engine has
// completed it, a call of this engine replays it while the batch still
// runs, instead of answering from the batch's stale claim.
func TestDoBatchLandsFlightsItDidNotAcquire(t *testing.T) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e1, err := idem.New(mem, &idem.Config{Wait: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e2, err := idem.New(mem, &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, err := e2.Begin(ctx, req("held"), nil)
	if err != nil || !held.Acquired {
		t.Fatalf("Begin: %+v, %v", held, err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Concurrency 1: "running" holds the one slot until released.
		idem.DoBatch(ctx, e1, ids(t, "running", "held"), &idem.BatchOptions[string]{Concurrency: 1}, func(ctx context.Context, i int) (string, error) {
			if i == 0 {
				close(started)
				<-release
			}
			return "batch", nil
		})
	}()
	<-started
	if err := e2.Complete(ctx, held.Token, "elsewhere"); err != nil {
		t.Fatal(err)
	}
	res, err := idem.Do(ctx, e1, req("held"), func(context.Context) (string, error) { return "again", nil })
	close(release)
	<-done
	if err != nil || !res.Replayed || res.Value != "elsewhere" {
		t.Fatalf("Do of a key completed elsewhere while the batch runs: %+v, %v; want the replay of %q", res, err, "elsewhere")
	}
}

// goid is the id of the calling goroutine, from its stack's header.
func goid() string {
	var b [64]byte
	n := runtime.Stack(b[:], false)
	return strings.Fields(string(b[:n]))[1]
}

// With concurrency 1 a batch starts no goroutine: every operation runs on
// the caller's goroutine, in order.
func TestDoBatchInOrderOnTheCallersGoroutine(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"batch claims", "claims one by one"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{})
			var eng *idem.Engine = en.eng
			if name == "claims one by one" {
				var err error
				if eng, err = idem.New(store.Store(plainStore{en.mem}), &idem.Config{Clock: en.clk}); err != nil {
					t.Fatal(err)
				}
			}
			caller := goid()
			var order []int
			res, errs := idem.DoBatch(context.Background(), eng, ids(t, "a", "b", "c", "d"), &idem.BatchOptions[int]{Concurrency: 1}, func(_ context.Context, i int) (int, error) {
				if g := goid(); g != caller {
					t.Errorf("item %d ran on goroutine %s, not the caller's %s", i, g, caller)
				}
				order = append(order, i)
				return i, nil
			})
			if fmt.Sprint(order) != "[0 1 2 3]" {
				t.Errorf("order %v", order)
			}
			for i := range res {
				if errs[i] != nil || res[i].Value != i {
					t.Errorf("item %d: %+v %v", i, res[i], errs[i])
				}
			}
		})
	}
}

// plainStore hides the store's batch powers: the engine claims each key
// of a batch alone.
type plainStore struct{ store.Store }

// A batch runs its operations on at most Concurrency goroutines, the
// caller's among them, and batches that follow each other while another
// runs reuse the same workers; once no batch runs, the workers end
// (goleak in TestMain).
func TestDoBatchBoundedReusedWorkers(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	const conc, n = 4, 64
	// A batch held open keeps the workers' generation alive.
	hold, holding := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		idem.DoBatch(ctx, en.eng, ids(t, "hold-0", "hold-1"), &idem.BatchOptions[int]{Concurrency: 2}, func(_ context.Context, i int) (int, error) {
			if i == 0 {
				close(holding)
				<-hold
			}
			return i, nil
		})
	}()
	<-holding
	var mu sync.Mutex
	seen := map[string]bool{}
	var running, most atomic.Int32
	batch := func(round int) map[string]bool {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("r%d-%d", round, i)
		}
		mine := map[string]bool{}
		// The first conc items wait for each other: each goroutine of the
		// batch runs one of them.
		var arrived atomic.Int32
		all := make(chan struct{})
		_, errs := idem.DoBatch(ctx, en.eng, ids(t, keys...), &idem.BatchOptions[int]{Concurrency: conc}, func(_ context.Context, i int) (int, error) {
			if i < conc {
				if arrived.Add(1) == conc {
					close(all)
				}
				<-all
			}
			r := running.Add(1)
			for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
			}
			runtime.Gosched()
			mu.Lock()
			mine[goid()] = true
			mu.Unlock()
			running.Add(-1)
			return i, nil
		})
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d item %d: %v", round, i, err)
			}
		}
		return mine
	}
	caller := goid()
	first := batch(0)
	for g := range first {
		seen[g] = true
	}
	second := batch(1)
	close(hold)
	<-done
	if m := most.Load(); m > conc {
		t.Errorf("%d operations at once, want at most %d", m, conc)
	}
	if len(first) != conc || len(second) != conc {
		t.Errorf("goroutines per batch: %d and %d, want %d", len(first), len(second), conc)
	}
	for g := range second {
		if g != caller && !seen[g] {
			t.Errorf("second batch ran on a new goroutine %s (first: %v)", g, first)
		}
	}
}

// A panic of an operation releases its key, lets the batch's other items
// answer, and reaches the caller, as Do's does.
func TestDoBatchPanicReachesTheCaller(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{})
			ctx := context.Background()
			var answered atomic.Int32
			got := func() (v any) {
				defer func() { v = recover() }()
				idem.DoBatch(ctx, en.eng, ids(t, "a", "boom", "c"), &idem.BatchOptions[int]{Concurrency: conc,
					Answered: func(i int, _ idem.Result[int], err error) {
						if i == 1 {
							t.Error("the item that panicked was answered")
						}
						answered.Add(1)
					}}, func(_ context.Context, i int) (int, error) {
					if i == 1 {
						panic("boom")
					}
					return i, nil
				})
				return nil
			}()
			if got != "boom" || answered.Load() != 2 {
				t.Fatalf("panic %v, %d answered; want boom and 2", got, answered.Load())
			}
			res, err := idem.Do(ctx, en.eng, req("boom"), func(context.Context) (int, error) { return 9, nil })
			if err != nil || res.Replayed || res.Value != 9 {
				t.Errorf("the key of the panic is not released: %+v %v", res, err)
			}
		})
	}
}

// Answered hears each item as soon as its outcome is recorded, not when
// the batch is done: item 1 runs only once item 0's answer was heard,
// with its outcome in the store.
func TestDoBatchAnsweredPerItem(t *testing.T) {
	t.Parallel()
	for _, conc := range []int{0, 2} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{})
			ctx := context.Background()
			heard := make(chan idem.Result[string], 1)
			var calls [4]atomic.Int32
			batch := ids(t, "first", "second", "done", "first")
			if _, err := idem.Do(ctx, en.eng, req("done"), func(context.Context) (string, error) { return "earlier", nil }); err != nil {
				t.Fatal(err)
			}
			res, errs := idem.DoBatch(ctx, en.eng, batch, &idem.BatchOptions[string]{Concurrency: conc,
				Answered: func(i int, r idem.Result[string], err error) {
					calls[i].Add(1)
					if i == 0 {
						if err != nil {
							t.Errorf("first: %v", err)
						}
						heard <- r
					}
				}}, func(_ context.Context, i int) (string, error) {
				if i == 1 {
					r := <-heard
					rec, err := en.mem.Get(ctx, batch[0].StoreKey.String())
					if r.Value != "v0" || r.Recorded != store.StatusCompleted || err != nil || rec.Status != store.StatusCompleted {
						t.Errorf("first answered %+v with record %+v, %v; want its completed outcome", r, rec, err)
					}
				}
				return fmt.Sprintf("v%d", i), nil
			})
			for i := range calls {
				if n := calls[i].Load(); n != 1 {
					t.Errorf("item %d answered %d times", i, n)
				}
			}
			if errs[0] != nil || errs[1] != nil || res[1].Value != "v1" || !res[2].Replayed || res[2].Value != "earlier" || !errors.Is(errs[3], idem.ErrInProgress) {
				t.Errorf("results %+v %v", res, errs)
			}
		})
	}
}

// Batches run with a context from WithBatchWorkers run on its workers,
// which outlive each batch: batches that follow each other, with none
// running in between, run on the same goroutines; stop ends them (goleak
// in TestMain), and a batch after stop still runs, on goroutines of its
// own.
func TestBatchWorkersKeptBetweenBatches(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	const conc = 4
	wctx, stop := idem.WithBatchWorkers(context.Background())
	batch := func(ctx context.Context, o idem.BatchOptions[int], round int) map[string]bool {
		keys := make([]string, 2*conc)
		for i := range keys {
			keys[i] = fmt.Sprintf("runner-%d-%d", round, i)
		}
		var mu sync.Mutex
		mine := map[string]bool{}
		// The first conc items wait for each other: each goroutine of the
		// batch runs one of them.
		var arrived atomic.Int32
		all := make(chan struct{})
		o.Concurrency = conc
		_, errs := idem.DoBatch(ctx, en.eng, ids(t, keys...), &o, func(_ context.Context, i int) (int, error) {
			if i < conc {
				if arrived.Add(1) == conc {
					close(all)
				}
				<-all
			}
			mu.Lock()
			mine[goid()] = true
			mu.Unlock()
			return i, nil
		})
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d item %d: %v", round, i, err)
			}
		}
		if len(mine) != conc {
			t.Errorf("round %d ran on %d goroutines, want %d", round, len(mine), conc)
		}
		return mine
	}
	first := batch(wctx, idem.BatchOptions[int]{}, 0)
	second := batch(wctx, idem.BatchOptions[int]{}, 1)
	if !maps.Equal(first, second) {
		t.Errorf("the second batch ran on %v, the first on %v: want the same goroutines", second, first)
	}
	stop()
	stop() // twice is fine
	after := batch(wctx, idem.BatchOptions[int]{}, 2)
	for g := range after {
		if g != goid() && first[g] {
			t.Errorf("a batch after stop ran on the stopped workers' %s", g)
		}
	}
}

// Batch workers made inside a testing/synctest bubble serve the bubble's
// batches and, stopped, leave nothing behind when the bubble ends
// (workers that kept a timer or a goroutine would make synctest panic);
// its batches settle each key on its own outcome, a failure as a
// failure.
func TestBatchWorkersInsideASynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx, stop := idem.WithBatchWorkers(context.Background())
		defer stop()
		fail := errors.New("refused")
		for round := range 3 {
			keys := []string{fmt.Sprint("s-ok-", round), fmt.Sprint("s-fail-", round), fmt.Sprint("s-slow-", round)}
			var answered atomic.Int32
			res, errs := idem.DoBatch(ctx, en.eng, ids(t, keys...), &idem.BatchOptions[string]{Answered: func(int, idem.Result[string], error) { answered.Add(1) }},
				func(_ context.Context, i int) (string, error) {
					switch i {
					case 1:
						return "", idem.Terminal(fail, "refused")
					case 2:
						time.Sleep(time.Second) // fake time in the bubble
					}
					return keys[i], nil
				})
			if errs[0] != nil || res[0].Value != keys[0] || !errors.Is(errs[1], fail) || errs[2] != nil || res[2].Value != keys[2] || answered.Load() != 3 {
				t.Errorf("round %d: %+v %v, %d answered", round, res, errs, answered.Load())
			}
			rec, err := en.mem.Get(context.Background(), ids(t, keys[1])[0].StoreKey.String())
			if err != nil || rec.Status != store.StatusFailed {
				t.Errorf("round %d: the failed key's record %+v, %v; want FAILED", round, rec, err)
			}
		}
	})
}
