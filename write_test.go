// Tests of the write loop: transient faults, lost replies, a cancelled
// caller.

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
)

// A Complete that fails on transient faults for longer than the lease is
// retried while the lease keeps being renewed: once it lands, a duplicate
// long after the original lease replays instead of running again.
func TestCompleteRetriedThroughTransientFaults(t *testing.T) {
	for _, method := range []string{"complete", "fail", "release"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				en := setup(t, idem.Config{Clock: store.SystemClock{}, Lease: 2 * time.Second})
				other := en.another(t, idem.Config{})
				ctx := context.Background()
				var faultsUntil time.Time
				en.store.FailWith(method, func(int64) error {
					if time.Now().Before(faultsUntil) {
						return fmt.Errorf("connection reset by peer: %w", store.ErrUnavailable)
					}
					return nil
				})
				runs := 0
				r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
					runs++
					faultsUntil = time.Now().Add(5 * time.Second) // 2.5 leases of faults
					switch method {
					case "fail":
						return "", idem.Terminal(errors.New("card declined"), "declined")
					case "release":
						return "", errors.New("try again later")
					}
					return "charged", nil
				})
				if method == "complete" && (err != nil || r.Value != "charged") {
					t.Fatalf("first call: %+v, %v", r, err)
				}
				if n := en.store.Calls(method); n < 3 || int64(en.obs.Count(observe.OutcomeWriteRetried)) != n-1 {
					t.Fatalf("%d %s attempts, %d counted retries; want several", n, method, en.obs.Count(observe.OutcomeWriteRetried))
				}
				// A claim being released needs no renewal; an outcome being
				// recorded does.
				if n := en.store.Calls("extend"); (method == "release") != (n == 0) || method != "release" && n < 2 {
					t.Fatalf("lease renewed %d times while the %s was retried", n, method)
				}
				if n := en.obs.Count(observe.OutcomeCompleteFailed) + en.obs.Count(observe.OutcomeStoreError); n != 0 {
					t.Fatalf("a write that landed was counted as failed: %v", en.obs.Snapshot())
				}
				time.Sleep(10 * time.Second) // fake time: long past the original lease
				r, err = idem.Do(ctx, other, req("k"), func(context.Context) (string, error) { runs++; return "second", nil })
				switch method {
				case "complete":
					if err != nil || !r.Replayed || r.Value != "charged" || runs != 1 {
						t.Fatalf("duplicate after the lease: %+v, %v, runs %d; want the replay", r, err, runs)
					}
				case "fail":
					if !errors.Is(err, idem.ErrTerminal) || !r.Replayed || runs != 1 {
						t.Fatalf("duplicate after the lease: %+v, %v, runs %d; want the stored failure", r, err, runs)
					}
				case "release":
					if err != nil || r.Value != "second" || runs != 2 {
						t.Fatalf("retry after a release: %+v, %v, runs %d; want a second run", r, err, runs)
					}
				}
			})
		})
	}
}

// The write loop keeps the lease of a call whose caller's deadline passes
// while its Complete is retried: renewed past the deadline until the write
// lands, so another engine replays instead of taking the key over.
func TestCompleteRetriedPastTheCallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		other := en.another(t, idem.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var faultsUntil time.Time
		en.store.FailWith("complete", func(int64) error {
			if time.Now().Before(faultsUntil) {
				return fmt.Errorf("connection reset by peer: %w", store.ErrUnavailable)
			}
			return nil
		})
		runs := 0
		done := make(chan error)
		go func() {
			r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
				runs++
				faultsUntil = time.Now().Add(5 * time.Second) // past the 2s deadline
				return "charged", nil
			})
			if err == nil && r.Value != "charged" {
				err = fmt.Errorf("first call: %+v", r)
			}
			done <- err
		}()
		time.Sleep(3 * time.Second) // fake time: the deadline has passed, the write is retried
		if _, err := idem.Do(context.Background(), other, req("k"), func(context.Context) (string, error) { runs++; return "second", nil }); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("duplicate while the write is retried past the deadline: %v, runs %d", err, runs)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := en.store.Calls("extend"); n < 6 {
			t.Fatalf("lease renewed %d times in 5s of retried writes, at 2s/3 intervals", n)
		}
		time.Sleep(10 * time.Second) // fake time: long past the deadline's lease
		r, err := idem.Do(context.Background(), other, req("k"), func(context.Context) (string, error) { runs++; return "second", nil })
		if err != nil || !r.Replayed || r.Value != "charged" || runs != 1 {
			t.Fatalf("duplicate after the deadline: %+v, %v, runs %d; want the replay", r, err, runs)
		}
	})
}

// A write whose reply is lost is retried; the retry meets its own claim
// already settled and takes that as success, not as a fenced write.
func TestLostWriteReplyIsRecognisedAsOwn(t *testing.T) {
	for _, method := range []string{"complete", "fail", "release"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				en := setup(t, idem.Config{Clock: store.SystemClock{}})
				en.store.LoseReplies(method, func(n int64) error {
					if n == 1 {
						return fmt.Errorf("i/o timeout: %w", store.ErrUnavailable)
					}
					return nil
				})
				ctx := context.Background()
				_, _ = idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
					switch method {
					case "fail":
						return "", idem.Terminal(errors.New("card declined"), "declined")
					case "release":
						return "", errors.New("try again later")
					}
					return "charged", nil
				})
				if n := en.store.Calls(method); n != 2 {
					t.Fatalf("%d %s calls, want the lost one and one retry", n, method)
				}
				bad := en.obs.Count(observe.OutcomeFenced) + en.obs.Count(observe.OutcomeCompleteFailed) + en.obs.Count(observe.OutcomeStoreError)
				if bad != 0 {
					t.Fatalf("own settled record counted as a failure: %v", en.obs.Snapshot())
				}
			})
		})
	}
}

func TestOutcomeWrittenEvenIfCallerCancels(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { cancel(); return 7, nil })
	if err != nil || r.Value != 7 {
		t.Fatal(r, err)
	}
	rec, err := en.mem.Get(context.Background(), r.StoreKey)
	if err != nil || rec.Status != store.StatusCompleted {
		t.Fatalf("record after the caller cancelled: %+v %v", rec, err)
	}
}

// hangFirstComplete is a store whose first Complete never answers: its
// request hangs (a connection that stalls rather than fails) until the
// attempt's context ends.
type hangFirstComplete struct {
	store.Store
	calls atomic.Int32
}

func (s *hangFirstComplete) Complete(ctx context.Context, p store.CompleteParams) error {
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err())
	}
	return s.Store.Complete(ctx, p)
}

// An outcome write whose first attempt hangs, while the renewals fail
// too, is tried again before the lease can lapse: the attempt is bounded by
// half the lease (2s lease: 1s), not only by a third of WriteTimeout (10s:
// 3.3s). Another process arriving once the lease would have passed finds
// the outcome and replays; it does not take the key over and run it
// again.
func TestHungCompleteAttemptIsRetriedWithinTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		hang := &hangFirstComplete{Store: en.store}
		x, err := idem.New(hang, &idem.Config{Clock: store.SystemClock{}, Lease: 2 * time.Second, WriteTimeout: 10 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		y := en.another(t, idem.Config{Lease: 2 * time.Second})
		en.store.FailAlways("extend", store.ErrUnavailable) // renewals fail: the lease ends 2s after the claim
		ctx := context.Background()
		var runs atomic.Int32
		fn := func(context.Context) (string, error) { runs.Add(1); return "receipt", nil }
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, x, req("k"), fn)
			done <- err
		}()
		time.Sleep(2*time.Second + 100*time.Millisecond) // fake time: past the claim's lease
		r, err := idem.Do(ctx, y, req("k"), fn)
		xerr := <-done
		if err != nil || !r.Replayed || runs.Load() != 1 {
			t.Fatalf("the other process, past the lease: %+v, %v; runs %d, want a replay and 1 run", r, err, runs.Load())
		}
		if xerr != nil {
			t.Fatal(xerr)
		}
		if got := hang.calls.Load(); got != 2 {
			t.Errorf("%d Complete attempts, want 2 (the hung one, then one that landed)", got)
		}
	})
}
