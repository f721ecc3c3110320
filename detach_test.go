// Tests of Detach: a running claim handed off to other work.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// An operation run by Do hands its claim off with Detach: the engine
// records nothing when it returns (not even its error), duplicates see the
// reference, and the token completes the key from another process. A
// deadline on the call's context (a Lambda invocation's) does not bound
// the handed-off claim.
func TestDetachHandsTheRunningClaimOff(t *testing.T) {
	en := setup(t, idem.Config{})
	worker := en.another(t, idem.Config{})
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(3*time.Second))
	defer cancel()
	var tok idem.Token
	for _, opErr := range []error{nil, errors.New("handler failed after handing off")} {
		tok = idem.Token{}
		key := fmt.Sprintf("detach-%v", opErr != nil)
		res, err := idem.Do(ctx, en.eng, req(key), func(ctx context.Context) (string, error) {
			var err error
			if tok, err = idem.Detach(ctx, 15*time.Minute, "job-42"); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			return "accepted", opErr
		})
		if res.Value != "accepted" || !errors.Is(err, opErr) {
			t.Fatalf("Do that detached: %+v, %v", res, err)
		}
		st, err := en.eng.Status(context.Background(), tok.Key)
		if err != nil || st.Status != idem.StatusInProgress || st.Ref != "job-42" || !st.LeaseUntil.Equal(t0.Add(15*time.Minute)) {
			t.Fatalf("record after Detach: %+v, %v", st, err)
		}
	}
	if en.store.Calls("complete")+en.store.Calls("release")+en.store.Calls("fail") != 0 {
		t.Fatal("the engine wrote an outcome for a handed-off claim")
	}
	if n := en.obs.Count(observe.OutcomeHandedOff); n != 2 {
		t.Fatalf("handed_off counted %d times, want 2", n)
	}
	en.clock.Advance(10 * time.Minute) // past the invocation's deadline and the engine's lease
	_, err := idem.Do(context.Background(), worker, req("detach-false"), func(context.Context) (string, error) {
		t.Fatal("a duplicate ran a handed-off key")
		return "", nil
	})
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ipe.Ref != "job-42" {
		t.Fatalf("duplicate of a handed-off key: %v, want an InProgressError with the reference", err)
	}
	b, _ := en.eng.Status(context.Background(), mustKeyOf(t, req("detach-false")))
	if err := worker.Complete(context.Background(), b.Token(), "done later"); err != nil {
		t.Fatalf("Complete through the handed-off token: %v", err)
	}
	res, err := idem.Do(context.Background(), en.eng, req("detach-false"), func(context.Context) (string, error) { return "again", nil })
	if err != nil || res.Value != "done later" || !res.Replayed {
		t.Fatalf("Do after the worker completed: %+v, %v", res, err)
	}
	if _, err := idem.Detach(context.Background(), time.Minute, ""); err == nil {
		t.Fatal("Detach outside an operation succeeded")
	}
}

// An in-process duplicate of a call that handed off learns the reference
// too, from the flight it joins.
func TestDetachReferenceReachesInProcessDuplicates(t *testing.T) {
	en := setup(t, idem.Config{})
	detached, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), en.eng, req("f"), func(ctx context.Context) (string, error) {
			if _, err := idem.Detach(ctx, time.Minute, "queue/7"); err != nil {
				return "", err
			}
			close(detached)
			<-finish
			return "accepted", nil
		})
		done <- err
	}()
	<-detached
	_, err := idem.Do(context.Background(), en.eng, req("f"), func(context.Context) (string, error) { return "", nil })
	close(finish)
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ipe.Ref != "queue/7" || !ipe.LeaseUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("in-process duplicate: %v, want an InProgressError with the reference and the expected completion", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func mustKeyOf(t *testing.T, r idem.Request) idem.StoreKey {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// A caller configured to wait for a busy key does not wait for handed-off
// work: it runs for its expected completion, far past any wait.
func TestWaitDoesNotWaitForHandedOffWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		waiter := en.another(t, idem.Config{Wait: time.Minute})
		ctx := context.Background()
		if _, err := idem.Do(ctx, en.eng, req("w"), func(ctx context.Context) (string, error) {
			_, err := idem.Detach(ctx, time.Hour/2, "job-9")
			return "accepted", err
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := idem.Do(ctx, waiter, req("w"), func(context.Context) (string, error) { return "", nil })
		var ipe *idem.InProgressError
		if !errors.As(err, &ipe) || ipe.Ref != "job-9" {
			t.Fatalf("waiting duplicate of handed-off work: %v", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("the duplicate waited %v for handed-off work", waited)
		}
	})
}

// failingAttach refuses every Extend that attaches a reference: a hand-off
// whose write cannot land.
type failingAttach struct{ store.Store }

func (f failingAttach) Extend(ctx context.Context, p store.ExtendParams) error {
	if p.Ref != "" {
		return fmt.Errorf("connection reset: %w", store.ErrUnavailable)
	}
	return f.Store.Extend(ctx, p)
}

// A Detach whose write fails hands nothing off: the operation goes on in
// its caller and its lease is renewed again, so no one takes the key over
// while it runs.
func TestFailedDetachKeepsTheLeaseRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		cfg := idem.Config{Lease: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond, WriteTimeout: 60 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		holder, err := idem.New(failingAttach{mem}, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		other, _ := idem.New(mem, &cfg)
		var runs atomic.Int32
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(context.Background(), holder, req("d"), func(ctx context.Context) (int, error) {
				runs.Add(1)
				if _, err := idem.Detach(ctx, time.Minute, "job"); err == nil {
					return 0, errors.New("Detach succeeded through a store that refuses it")
				}
				time.Sleep(time.Second) // the work, done here after all
				return 1, ctx.Err()
			})
			done <- err
		}()
		time.Sleep(700 * time.Millisecond) // past the lease the failed Detach started from
		_, err = idem.Do(context.Background(), other, req("d"), func(context.Context) (int, error) { runs.Add(1); return 2, nil })
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("a second caller during the work: %v, want ErrInProgress", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the operation ran %d times", n)
		}
	})
}
