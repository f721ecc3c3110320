package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/store"
)

// The hole of a batch run in order: its tail waits behind a slow item. Two
// members of one group share a store, lease 2s. Member X's batch is [a
// record whose handler takes 3.5s, M]; the same M is delivered to member Y
// after 2.5s, while X's M still waits for its turn. Y must find M held by
// X (its claim renewed together with the batch's other waiting claims,
// in one ExtendBatch a tick), and X then runs M: M runs once, by X.
func TestDoBatchHoldsTheClaimsOfItemsWaitingTheirTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Lease: 2 * time.Second, Clock: store.SystemClock{}})
		y := en.another(t, idem.Config{Lease: 2 * time.Second})
		ctx := context.Background()
		var runs sync.Map // key → *atomic.Int32
		ran := func(k string) int32 {
			v, _ := runs.LoadOrStore(k, new(atomic.Int32))
			return v.(*atomic.Int32).Load()
		}
		run := func(k string) {
			v, _ := runs.LoadOrStore(k, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
		}
		keys := []string{"slow", "m-1", "m-2", "m-3"}
		done := make(chan []error)
		go func() {
			_, errs := idem.DoBatch(ctx, en.eng, ids(t, keys...), &idem.BatchOptions[string]{Concurrency: 1}, func(_ context.Context, i int) (string, error) {
				if i == 0 {
					time.Sleep(3500 * time.Millisecond) // the slow head record (fake time)
				}
				run(keys[i])
				return "x:" + keys[i], nil
			})
			done <- errs
		}()
		time.Sleep(2500 * time.Millisecond) // past the first lease of every claim of the batch
		for _, k := range keys[1:] {
			_, err := idem.Do(ctx, y, req(k), func(context.Context) (string, error) { run(k); return "y:" + k, nil })
			var ipe *idem.InProgressError
			if !errors.As(err, &ipe) {
				t.Errorf("member Y's copy of %s while it waits in X's batch: %v, want in progress (held by X)", k, err)
			}
		}
		errs := <-done
		for i, err := range errs {
			if err != nil {
				t.Errorf("X's %s: %v", keys[i], err)
			}
		}
		for _, k := range keys {
			if n := ran(k); n != 1 {
				t.Errorf("%s ran %d times, want once", k, n)
			}
		}
		// The waiting claims were renewed together: fewer batched renewals
		// than single ones would have been (3 claims × ticks).
		if n := en.store.Calls("extend_batch"); n == 0 {
			t.Error("no renewal went as one ExtendBatch")
		}
		if n, each := en.store.Calls("extend_batch"), en.store.Calls("extend"); n*2 > each {
			t.Errorf("%d batched renewals for %d Extends: the waiting claims were not renewed together", n, each)
		}
		for _, k := range keys {
			res, err := idem.Do(ctx, y, req(k), func(context.Context) (string, error) { run(k); return "again", nil })
			if err != nil || !res.Replayed || res.Value != "x:"+k {
				t.Errorf("replay of %s: %+v %v, want X's outcome", k, res, err)
			}
		}
	})
}

// An item whose claim was lost while it waited does not run. X's renewals
// fail (X cannot reach the store's writes for a while), so M's lease
// passes and Y takes M over and runs it; when M's turn comes in X's batch,
// its claim is no longer X's: X does not run it, and its answer wraps
// ErrLeaseLost, a consumer's Leave.
func TestDoBatchDoesNotRunAnItemWhoseClaimLapsedWhileItWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Lease: 2 * time.Second, Clock: store.SystemClock{}})
		y := en.another(t, idem.Config{Lease: 2 * time.Second})
		ctx := context.Background()
		var xRuns, yRuns atomic.Int32
		down := errors.Join(store.ErrUnavailable, errors.New("connection reset"))
		var partitioned atomic.Bool
		partitioned.Store(true)
		en.store.FailWith("extend_batch", func(int64) error {
			if partitioned.Load() {
				return down
			}
			return nil
		})
		en.store.FailWith("extend", func(int64) error {
			if partitioned.Load() {
				return down
			}
			return nil
		})
		type answer struct {
			res  []idem.Result[string]
			errs []error
		}
		done := make(chan answer)
		go func() {
			res, errs := idem.DoBatch(ctx, en.eng, ids(t, "slow", "m"), &idem.BatchOptions[string]{Concurrency: 1}, func(_ context.Context, i int) (string, error) {
				if i == 0 {
					time.Sleep(3500 * time.Millisecond)
					partitioned.Store(false) // X can write again: its renewal of m is now refused
					return "slow", nil
				}
				xRuns.Add(1)
				return "x", nil
			})
			done <- answer{res, errs}
		}()
		time.Sleep(2500 * time.Millisecond)
		// Y's copy of m takes the lapsed claim over and runs.
		res, err := idem.Do(ctx, y, req("m"), func(context.Context) (string, error) { yRuns.Add(1); return "y", nil })
		if err != nil || res.Replayed {
			t.Fatalf("Y's copy of m after X's lease passed: %+v %v, want it to take over and run", res, err)
		}
		a := <-done
		if xRuns.Load() != 0 || yRuns.Load() != 1 {
			t.Fatalf("m ran %d times in X and %d in Y, want once, in Y", xRuns.Load(), yRuns.Load())
		}
		if !errors.Is(a.errs[1], idem.ErrLeaseLost) {
			t.Fatalf("X's answer for m: %v, want ErrLeaseLost", a.errs[1])
		}
		if v := consume.Decide(a.res[1], a.errs[1], time.Now()); v.Action != consume.Leave {
			t.Errorf("verdict for m in X: %v, want leave", v.Action)
		}
		if a.errs[0] != nil {
			t.Errorf("X's slow item: %v", a.errs[0])
		}
		r, err := idem.Do(ctx, en.eng, req("m"), func(context.Context) (string, error) { xRuns.Add(1); return "again", nil })
		if err != nil || !r.Replayed || r.Value != "y" {
			t.Errorf("m afterwards: %+v %v, want Y's outcome replayed", r, err)
		}
	})
}

// A batch's successes are written together: items run in order, each
// handing its Complete to the batch and going on to the next, and the
// Completes that gather while one write is in flight go in one
// CompleteBatch. The first Complete is held until the last item ran: the
// others then go in one round trip. Every item is answered once its own
// write landed.
func TestDoBatchWritesItsOutcomesTogether(t *testing.T) {
	synctest.Test(t, testDoBatchWritesItsOutcomesTogether)
}

func testDoBatchWritesItsOutcomesTogether(t *testing.T) {
	en := setup(t, idem.Config{Clock: store.SystemClock{}})
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("w-%d", i)
	}
	lastRan := make(chan struct{})
	en.store.FailWith("complete", func(n int64) error {
		if n == 1 {
			<-lastRan
		}
		return nil
	})
	var answered atomic.Int32
	res, errs := idem.DoBatch(context.Background(), en.eng, ids(t, keys...), &idem.BatchOptions[int]{Concurrency: 1,
		Answered: func(i int, r idem.Result[int], err error) {
			if err != nil || r.Recorded != idem.StatusCompleted {
				t.Errorf("item %d answered %+v %v before its outcome was recorded", i, r, err)
			}
			answered.Add(1)
		}}, func(_ context.Context, i int) (int, error) {
		if i == len(keys)-1 {
			close(lastRan)
		}
		return i, nil
	})
	for i := range keys {
		if errs[i] != nil || res[i].Value != i || res[i].Recorded != idem.StatusCompleted {
			t.Fatalf("item %d: %+v %v", i, res[i], errs[i])
		}
	}
	if answered.Load() != int32(len(keys)) {
		t.Fatalf("%d answers, want %d", answered.Load(), len(keys))
	}
	if n := en.store.Calls("complete"); n != int64(len(keys)) {
		t.Fatalf("%d Completes, want %d", n, len(keys))
	}
	// The first write takes what was queued when it started (one item, or
	// two if the writer started late); all the rest gather behind it.
	if n := en.store.Calls("complete_batch"); n < 1 || n > 2 {
		t.Fatalf("%d CompleteBatch calls for %d items, want 1 or 2: the first write, then all the others together", n, len(keys))
	}
	for i, k := range keys {
		r, err := idem.Do(context.Background(), en.eng, req(k), func(context.Context) (int, error) { return -1, nil })
		if err != nil || !r.Replayed || r.Value != i {
			t.Fatalf("replay of %s: %+v %v", k, r, err)
		}
	}
}
