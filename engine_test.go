package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type env struct {
	store *faultstore.Store
	mem   *memstore.Store
	clock *clocktest.Clock
	clk   store.Clock // the clock the engines use
	obs   *observe.Counters
	eng   *idem.Engine
}

// setup builds an engine over a counting memstore with a manual clock.
func setup(t *testing.T, cfg idem.Config) *env {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	en := &env{store: faultstore.New(mem), mem: mem, clock: clocktest.New(t0), obs: &observe.Counters{}}
	if cfg.Clock == nil {
		cfg.Clock = en.clock
	}
	en.clk = cfg.Clock
	cfg.Observer = en.obs
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var err error
	if en.eng, err = idem.New(en.store, &cfg); err != nil {
		t.Fatal(err)
	}
	return en
}

// another returns a second engine (another process) over the same store.
func (en *env) another(t *testing.T, cfg idem.Config) *idem.Engine {
	t.Helper()
	cfg.Clock = en.clk
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := idem.New(en.store, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func req(key string) idem.Request {
	return idem.Request{Operation: "charge", Key: key, Payload: []byte(`{"amount":100,"currency":"EUR"}`)}
}

func TestReplayIsAFlagNotAnError(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context) (string, error) { runs++; return "receipt-1", nil }
	r1, err := idem.Do(ctx, en.eng, req("k"), fn)
	if err != nil || r1.Replayed || r1.Value != "receipt-1" || r1.Fence != 1 {
		t.Fatalf("first: %+v %v", r1, err)
	}
	r2, err := idem.Do(ctx, en.eng, req("k"), fn)
	if err != nil || !r2.Replayed || r2.Value != "receipt-1" || r2.Fence != 0 || r2.StoreKey != r1.StoreKey {
		t.Fatalf("second: %+v %v", r2, err)
	}
	if runs != 1 {
		t.Fatalf("ran %d times", runs)
	}
	if en.obs.Count(observe.OutcomeAcquired) != 1 || en.obs.Count(observe.OutcomeReplayed) != 1 {
		t.Fatalf("observer: %v", en.obs.Snapshot())
	}
}

func TestInProgressFailsFastWithLeaseEnd(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 20 * time.Second})
	other := en.another(t, idem.Config{Lease: 20 * time.Second})
	ctx := context.Background()
	inside, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
			close(inside)
			<-finish
			return 1, nil
		})
		done <- err
	}()
	<-inside
	_, err := idem.Do(ctx, other, req("k"), func(context.Context) (int, error) {
		t.Error("duplicate ran while the first was in progress")
		return 0, nil
	})
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) {
		t.Fatalf("duplicate: %v, want *InProgressError", err)
	}
	if !ipe.LeaseUntil.Equal(t0.Add(20*time.Second)) || ipe.RetryAfter(t0) != 20*time.Second {
		t.Fatalf("lease end %v retry-after %v", ipe.LeaseUntil, ipe.RetryAfter(t0))
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestInProcessDuplicatesShareOneClaim(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := idem.Config{}
				if wait {
					cfg.Wait = time.Minute
				}
				en := setup(t, cfg)
				ctx := context.Background()
				const n = 50
				var runs atomic.Int32
				inside, finish := make(chan struct{}), make(chan struct{})
				var wg sync.WaitGroup
				results := make(chan error, n)
				values := make(chan int, n)
				leader := func() {
					defer wg.Done()
					r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
						runs.Add(1)
						close(inside)
						<-finish
						return 42, nil
					})
					results <- err
					values <- r.Value
				}
				wg.Add(1)
				go leader()
				<-inside
				for range n - 1 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
							runs.Add(1)
							return -1, nil
						})
						results <- err
						values <- r.Value
					}()
				}
				if !wait {
					// Fail-fast duplicates return without touching the store.
					busy := 0
					for range n - 1 {
						if err := <-results; errors.Is(err, idem.ErrInProgress) {
							busy++
						}
					}
					if busy != n-1 {
						t.Fatalf("%d of %d duplicates got ErrInProgress", busy, n-1)
					}
				}
				synctest.Wait() // every waiting duplicate has joined the flight
				close(finish)
				wg.Wait()
				close(results)
				close(values)
				if wait {
					for err := range results {
						if err != nil {
							t.Fatalf("waiting duplicate: %v", err)
						}
					}
					for v := range values {
						if v != 42 {
							t.Fatalf("waiting duplicate got %d, want the leader's 42", v)
						}
					}
				}
				if runs.Load() != 1 {
					t.Fatalf("ran %d times", runs.Load())
				}
				if c := en.store.Calls("claim"); c != 1 {
					t.Fatalf("%d store claims for %d in-process duplicates, want 1", c, n)
				}
			})
		})
	}
}

func TestWaitPollsAnotherProcessUntilItFinishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		waiter := en.another(t, idem.Config{Wait: 10 * time.Second, WaitBackoff: 100 * time.Millisecond, MaxWaitBackoff: time.Second})
		ctx := context.Background()
		inside, finish := make(chan struct{}), make(chan struct{})
		go func() {
			_, _ = idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
				close(inside)
				<-finish
				return "first", nil
			})
		}()
		<-inside
		go func() {
			time.Sleep(2 * time.Second) // fake time: the first call runs for 2s
			close(finish)
		}()
		start := time.Now()
		r, err := idem.Do(ctx, waiter, req("k"), func(context.Context) (string, error) { return "second", nil })
		if err != nil || r.Value != "first" || !r.Replayed {
			t.Fatalf("waiter got %+v %v, want the first call's replayed value", r, err)
		}
		if el := time.Since(start); el < 2*time.Second || el > 3*time.Second {
			t.Fatalf("waiter returned after %v, want shortly after the first call's 2s", el)
		}
		if c := en.store.Calls("claim"); c < 4 {
			t.Fatalf("waiter polled %d times in 2s with 100ms..1s backoff", c-1)
		}
	})
}

func TestWaitGivesUpAfterItsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		waiter := en.another(t, idem.Config{Wait: time.Second, WaitBackoff: 100 * time.Millisecond, MaxWaitBackoff: 200 * time.Millisecond})
		ctx := context.Background()
		inside, finish := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { close(inside); <-finish; return 1, nil })
		}()
		<-inside
		start := time.Now()
		_, err := idem.Do(ctx, waiter, req("k"), func(context.Context) (int, error) { return 2, nil })
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("after the wait budget: %v, want ErrInProgress", err)
		}
		if el := time.Since(start); el != time.Second {
			t.Fatalf("gave up after %v, want exactly the 1s budget", el)
		}
		close(finish)
		wg.Wait()
	})
}

func TestErrorPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("plain error releases so a retry runs", func(t *testing.T) {
		t.Parallel()
		en := setup(t, idem.Config{})
		runs := 0
		boom := errors.New("upstream timeout")
		fn := func(context.Context) (int, error) {
			runs++
			if runs == 1 {
				return 0, boom
			}
			return 5, nil
		}
		if _, err := idem.Do(ctx, en.eng, req("k"), fn); !errors.Is(err, boom) {
			t.Fatalf("first: %v", err)
		}
		r, err := idem.Do(ctx, en.eng, req("k"), fn)
		if err != nil || r.Value != 5 || r.Replayed || runs != 2 {
			t.Fatalf("retry: %+v %v runs=%d", r, err, runs)
		}
		if en.obs.Count(observe.OutcomeReleased) != 1 {
			t.Fatalf("observer: %v", en.obs.Snapshot())
		}
	})
	t.Run("panic releases and is re-raised", func(t *testing.T) {
		t.Parallel()
		en := setup(t, idem.Config{})
		func() {
			defer func() {
				if r := recover(); r != "kaboom" {
					t.Fatalf("recovered %v, want the operation's panic", r)
				}
			}()
			_, _ = idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { panic("kaboom") })
		}()
		r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 9, nil })
		if err != nil || r.Value != 9 {
			t.Fatalf("retry after panic: %+v %v", r, err)
		}
	})
	t.Run("terminal error is stored and replayed", func(t *testing.T) {
		t.Parallel()
		en := setup(t, idem.Config{})
		declined := errors.New("card declined")
		_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
			return 0, idem.Terminal(declined, "card_declined")
		})
		var te *idem.TerminalError
		if !errors.As(err, &te) || te.Replayed || !errors.Is(err, declined) {
			t.Fatalf("first: %v", err)
		}
		r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
			t.Error("ran again after a terminal error")
			return 0, nil
		})
		if !errors.As(err, &te) || !te.Replayed || te.Code != "card_declined" || te.Message != "card declined" || !r.Replayed {
			t.Fatalf("replay: %+v %v", r, err)
		}
	})
	t.Run("failed complete still returns the result", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			en := setup(t, idem.Config{Clock: store.SystemClock{}})
			en.store.FailAlways("complete", fmt.Errorf("network: %w", store.ErrUnavailable))
			start := time.Now()
			r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) { return "charged", nil })
			if err != nil || r.Value != "charged" {
				t.Fatalf("result hidden by a failed complete: %+v %v", r, err)
			}
			// Retried until WriteTimeout (10s by default) passed, then given up.
			if el := time.Since(start); el < 9*time.Second || el > 10*time.Second {
				t.Fatalf("gave up on the complete after %v, want just under WriteTimeout", el)
			}
			if n := en.store.Calls("complete"); n < 5 || int64(en.obs.Count(observe.OutcomeWriteRetried)) != n-1 {
				t.Fatalf("%d complete attempts, %d counted retries", n, en.obs.Count(observe.OutcomeWriteRetried))
			}
			if en.obs.Count(observe.OutcomeCompleteFailed) != 1 {
				t.Fatalf("observer: %v", en.obs.Snapshot())
			}
			// The claim stays IN_PROGRESS: a duplicate is held off, not re-run.
			_, err = idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) { return "again", nil })
			if !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("duplicate after a failed complete: %v", err)
			}
		})
	})
}

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

// A holder whose record expired, was deleted by a TTL and claimed afresh
// (fence 1 again) can neither release nor fail the new holder's claim.
func TestHolderOfAVanishedRecordCannotTouchTheNextClaim(t *testing.T) {
	for _, ending := range []string{"retryable error", "terminal error", "success"} {
		t.Run(ending, func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{Expiry: 5 * time.Second, RenewInterval: -1})
			second := en.another(t, idem.Config{Expiry: 5 * time.Second})
			ctx := context.Background()
			inside, finish := make(chan struct{}), make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
					close(inside)
					<-finish
					switch ending {
					case "retryable error":
						return "", errors.New("timeout")
					case "terminal error":
						return "", idem.Terminal(errors.New("stale decline"), "declined")
					}
					return "stale", nil
				})
				errc <- err
			}()
			<-inside
			en.clock.Advance(6 * time.Second) // past the expiry: a TTL deletes the record
			r := req("k")
			id, _ := r.Identity()
			if err := en.mem.Delete(ctx, id.StoreKey.String()); err != nil {
				t.Fatal(err)
			}
			inside2, finish2 := make(chan struct{}), make(chan struct{})
			res2 := make(chan idem.Result[string], 1)
			go func() {
				r, _ := idem.Do(ctx, second, req("k"), func(context.Context) (string, error) {
					close(inside2)
					<-finish2
					return "fresh", nil
				})
				res2 <- r
			}()
			<-inside2
			before, err := en.mem.Get(ctx, id.StoreKey.String())
			if err != nil || before.Fence != 1 {
				t.Fatalf("second claim: %+v, %v; want fence 1 again", before, err)
			}
			close(finish) // the first holder ends now
			<-errc
			after, err := en.mem.Get(ctx, id.StoreKey.String())
			if err != nil || after.Status != store.StatusInProgress || after.Owner != before.Owner {
				t.Fatalf("the first holder's %s changed the new claim: %+v, %v", ending, after, err)
			}
			// A third caller is held off while the second runs.
			if _, err := idem.Do(ctx, en.another(t, idem.Config{}), req("k"), func(context.Context) (string, error) { return "third", nil }); !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("third caller during the second claim: %v, want ErrInProgress", err)
			}
			close(finish2)
			if r := <-res2; r.Value != "fresh" {
				t.Fatalf("second holder: %+v", r)
			}
			if got, _ := en.mem.Get(ctx, id.StoreKey.String()); got.Status != store.StatusCompleted || string(got.Result) != `"fresh"` {
				t.Fatalf("record after the second holder: %+v", got)
			}
		})
	}
}

// A terminal error too large for the store is replaced by a bounded
// marker, as a too-large result is: the key never stays IN_PROGRESS for a
// retry to run the operation again, whatever the store's limit.
func TestTerminalErrorTooLargeIsStoredAsABoundedMarker(t *testing.T) {
	for _, limit := range []int{1, 10, 100, 1 << 10} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			mem := memstore.New(&memstore.Config{SweepInterval: -1, MaxResultBytes: limit})
			t.Cleanup(func() { _ = mem.Close() })
			obs := &observe.Counters{}
			eng, err := idem.New(mem, &idem.Config{Clock: clocktest.New(t0), Observer: obs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			runs := 0
			declined := func(context.Context) (string, error) {
				runs++
				return "", &idem.TerminalError{Code: "declined", Message: strings.Repeat("m", 2000), Body: make([]byte, 450_000)}
			}
			if _, err := idem.Do(ctx, eng, req("k"), declined); !errors.Is(err, idem.ErrTerminal) {
				t.Fatalf("first call: %v", err)
			}
			_, err = idem.Do(ctx, eng, req("k"), declined)
			if !errors.Is(err, idem.ErrResultTooLarge) || runs != 1 {
				t.Fatalf("retry: %v, runs %d; want the stored too-large marker and no second run", err, runs)
			}
			r := req("k")
			id, _ := r.Identity()
			rec, _ := mem.Get(ctx, id.StoreKey.String())
			if rec.Status != store.StatusFailed || rec.Err.Size() > limit {
				t.Fatalf("stored marker: status %v, %d bytes over the limit %d", rec.Status, rec.Err.Size(), limit)
			}
			// A result too large for the store meets the same limit.
			_, err = idem.Do(ctx, eng, req("big"), func(context.Context) (string, error) { return strings.Repeat("r", 2000), nil })
			if err != nil {
				t.Fatal(err)
			}
			if _, err := idem.Do(ctx, eng, req("big"), declined); !errors.Is(err, idem.ErrResultTooLarge) {
				t.Fatalf("retry of a too-large result: %v", err)
			}
		})
	}
}

// An in-process duplicate that joins a flight whose lease has passed in
// this process's view (the holder is still writing its outcome) is told to
// retry later, never at a time in the past.
func TestJoinedFlightNeverReportsALeaseInThePast(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: time.Second, RenewInterval: -1})
	ctx := context.Background()
	inside, finish := make(chan struct{}), make(chan struct{})
	go func() {
		_, _ = idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { close(inside); <-finish; return 1, nil })
	}()
	<-inside
	en.clock.Advance(5 * time.Second)
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 2, nil })
	close(finish)
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) {
		t.Fatalf("duplicate: %v, want *InProgressError", err)
	}
	if ipe.LeaseUntil.Before(en.clock.Now()) {
		t.Fatalf("LeaseUntil %v is before now %v", ipe.LeaseUntil, en.clock.Now())
	}
}

func TestShortExpiryDefaultsTheLease(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	t.Cleanup(func() { _ = mem.Close() })
	e, err := idem.New(mem, &idem.Config{Expiry: time.Second})
	if err != nil {
		t.Fatalf("Config{Expiry: 1s}: %v", err)
	}
	if c := e.Config(); c.Lease != time.Second || c.RenewInterval >= c.Lease {
		t.Fatalf("Lease %v, RenewInterval %v; want the lease capped at the expiry", c.Lease, c.RenewInterval)
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", store.ErrUnavailable)
	en := setup(t, idem.Config{})
	en.store.FailAlways("claim", down)
	ran := false
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { ran = true; return 1, nil })
	var se *idem.StoreError
	if !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, store.ErrUnavailable) || ran {
		t.Fatalf("store down: %v ran=%v; want a claim *StoreError and no execution", err, ran)
	}
	open := setup(t, idem.Config{FailOpen: true})
	open.store.FailAlways("claim", down)
	r, err := idem.Do(ctx, open.eng, req("k"), func(context.Context) (int, error) { return 3, nil })
	if err != nil || r.Value != 3 || open.obs.Count(observe.OutcomeUnprotected) != 1 {
		t.Fatalf("FailOpen: %+v %v %v", r, err, open.obs.Snapshot())
	}
}

func TestTakeoverFencesTheZombie(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 10 * time.Second, RenewInterval: -1})
	rescuer := en.another(t, idem.Config{Lease: 10 * time.Second, RenewInterval: -1})
	ctx := context.Background()
	inside, finish := make(chan struct{}), make(chan struct{})
	zombie := make(chan idem.Result[string])
	var zombieKey string
	go func() {
		r, err := idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (string, error) {
			c, _ := idem.FromContext(ctx)
			zombieKey = c.DownstreamKey("bank")
			close(inside)
			<-finish
			return "zombie", nil
		})
		if err != nil {
			t.Errorf("zombie: %v", err)
		}
		zombie <- r
	}()
	<-inside
	en.clock.Advance(9999 * time.Millisecond)
	if _, err := idem.Do(ctx, rescuer, req("k"), func(context.Context) (string, error) { return "early", nil }); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("before the lease ended: %v", err)
	}
	en.clock.Advance(time.Millisecond)
	var rescueKey string
	r, err := idem.Do(ctx, rescuer, req("k"), func(ctx context.Context) (string, error) {
		c, _ := idem.FromContext(ctx)
		rescueKey = c.DownstreamKey("bank")
		if c.Fence != 2 {
			t.Errorf("takeover fence %d, want 2", c.Fence)
		}
		return "rescuer", nil
	})
	if err != nil || r.Value != "rescuer" || r.Fence != 2 {
		t.Fatalf("takeover: %+v %v", r, err)
	}
	close(finish)
	zr := <-zombie
	if zr.Value != "zombie" {
		t.Fatalf("zombie's own caller lost its value: %+v", zr)
	}
	if en.obs.Count(observe.OutcomeFenced) != 1 {
		t.Fatalf("zombie's complete was not refused: %v", en.obs.Snapshot())
	}
	rec, err := en.mem.Get(ctx, r.StoreKey)
	if err != nil || string(rec.Result) != `"rescuer"` || rec.Fence != 2 {
		t.Fatalf("record after zombie write: %+v %v", rec, err)
	}
	if zombieKey == "" || zombieKey != rescueKey {
		t.Fatalf("downstream key changed across the takeover: %q vs %q", zombieKey, rescueKey)
	}
}

func TestLeaseRenewalKeepsLongWorkProtected(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 3 * time.Second, RenewInterval: time.Second})
	other := en.another(t, idem.Config{Lease: 3 * time.Second})
	ctx := context.Background()
	inside, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { close(inside); <-finish; return 1, nil })
		done <- err
	}()
	<-inside
	for range 10 { // 10s of work with a 3s lease
		en.clock.Advance(time.Second)
		if _, err := idem.Do(ctx, other, req("k"), func(context.Context) (int, error) { return 2, nil }); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("at %v: %v, want ErrInProgress (lease renewed)", en.clock.Now().Sub(t0), err)
		}
	}
	if n := en.store.Calls("extend"); n != 10 {
		t.Fatalf("%d renewals in 10s at 1s intervals", n)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The engine's one renewal timer may still be set for the call's next
	// renewal; when it fires it renews nothing and is not set again.
	en.clock.Advance(2 * time.Second)
	if en.clock.Waiters() != 0 {
		t.Fatalf("%d timers left after the call returned", en.clock.Waiters())
	}
	if n := en.store.Calls("extend"); n != 10 {
		t.Fatalf("%d renewals, want none after the call returned", n-10)
	}
}

func TestLostLeaseCancelsTheOperation(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 3 * time.Second, RenewInterval: time.Second})
	ctx := context.Background()
	en.store.FailAlways("extend", &store.FencedError{Key: "k", Fence: 1, Current: 2, Status: store.StatusInProgress})
	inside := make(chan struct{})
	cause := make(chan error)
	go func() {
		_, _ = idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (int, error) {
			close(inside)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return 0, ctx.Err()
		})
	}()
	<-inside
	en.clock.Advance(time.Second)
	if err := <-cause; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("operation context cause: %v, want ErrLeaseLost", err)
	}
}

func TestLeaseDefaultsToContextDeadline(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 30 * time.Second, Clock: store.SystemClock{}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	_, err := idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (int, error) {
		c, _ := idem.FromContext(ctx)
		rec, err := en.mem.Get(ctx, c.Key)
		if err != nil {
			return 0, err
		}
		if got := store.FromMillis(rec.LeaseUntil); got.Sub(dl).Abs() > 5*time.Millisecond {
			t.Errorf("lease until %v, want the context deadline %v", got, dl)
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLocalCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	en := setup(t, idem.Config{Expiry: time.Hour, Cache: &idem.CacheConfig{MaxEntries: 2}})
	fn := func(context.Context) (string, error) { return "v", nil }
	if _, err := idem.Do(ctx, en.eng, req("a"), fn); err != nil {
		t.Fatal(err)
	}
	before := en.store.Total()
	r, err := idem.Do(ctx, en.eng, req("a"), fn)
	if err != nil || !r.Replayed || r.Value != "v" {
		t.Fatalf("cache hit: %+v %v", r, err)
	}
	if en.store.Total() != before || en.obs.Count(observe.OutcomeCacheHit) != 1 {
		t.Fatalf("cache hit made %d store calls", en.store.Total()-before)
	}
	// Bounded by entries: a and b, then c evicts a.
	for _, k := range []string{"b", "c"} {
		if _, err := idem.Do(ctx, en.eng, req(k), fn); err != nil {
			t.Fatal(err)
		}
	}
	before = en.store.Total()
	if _, err := idem.Do(ctx, en.eng, req("a"), fn); err != nil {
		t.Fatal(err)
	}
	if en.store.Total() == before {
		t.Fatal("evicted entry still served from cache")
	}
	// Entries expire with their record.
	en.clock.Advance(time.Hour)
	before = en.store.Total()
	r, err = idem.Do(ctx, en.eng, req("c"), fn)
	if err != nil || r.Replayed || en.store.Total() == before {
		t.Fatalf("expired entry: %+v %v", r, err)
	}
}

func TestResultOverLimitIsNotReplayedAsGarbage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	en := setup(t, idem.Config{MaxResultBytes: 16})
	big := strings.Repeat("x", 100)
	r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) { return big, nil })
	if err != nil || r.Value != big {
		t.Fatalf("first caller: %+v %v", r, err)
	}
	_, err = idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) {
		t.Error("re-ran an operation whose result was too large to store")
		return "", nil
	})
	if !errors.Is(err, idem.ErrResultTooLarge) {
		t.Fatalf("retry: %v, want ErrResultTooLarge", err)
	}
}

func TestDisabledByEnvironment(t *testing.T) {
	t.Setenv(idem.EnvDisabled, "true")
	en := setup(t, idem.Config{})
	runs := 0
	for range 3 {
		if _, err := idem.Do(context.Background(), en.eng, req("k"), func(context.Context) (int, error) { runs++; return 0, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 3 || en.store.Total() != 0 {
		t.Fatalf("disabled engine: runs=%d store calls=%d", runs, en.store.Total())
	}
}

func TestCancelledContextDoesNotClaim(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, context.Canceled) || en.store.Total() != 0 {
		t.Fatalf("cancelled: %v, %d store calls", err, en.store.Total())
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

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	bad := []idem.Config{
		{Expiry: time.Millisecond},
		{Lease: time.Hour, Expiry: time.Minute},
		{Lease: time.Second, RenewInterval: 2 * time.Second},
		{Wait: -1},
		{MaxResultBytes: -1},
	}
	for _, c := range bad {
		if _, err := idem.New(mem, &c); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := idem.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	if _, err := idem.New(mem, nil); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

type chargeIn struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
	Note    string `json:"note"`
}

func TestOpKeyFromInputComputedBeforeTheCall(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	runs := 0
	op, err := idem.NewOp(en.eng, "charge", func(ctx context.Context, in *chargeIn) (string, error) {
		runs++
		in.OrderID = "mutated" // must not change the recorded key
		return "ok-" + fmt.Sprint(in.Amount), nil
	}, &idem.OpConfig[*chargeIn, string]{
		Key: func(in *chargeIn) (string, error) { return in.OrderID, nil },
		Payload: func(in *chargeIn) ([]byte, error) {
			return fmt.Appendf(nil, `{"order":%q,"amount":%d}`, in.OrderID, in.Amount), nil
		},
		OnReplay: func(_ context.Context, s string) string { return s + " (replayed)" },
	})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 5, Note: "a"})
	if err != nil || r1.Value != "ok-5" {
		t.Fatal(r1, err)
	}
	// Note is outside the payload selection: same key, same fingerprint.
	r2, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 5, Note: "b"})
	if err != nil || r2.Value != "ok-5 (replayed)" || runs != 1 {
		t.Fatalf("replay: %+v %v runs=%d", r2, err, runs)
	}
	if _, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 6}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("same key, other amount: %v", err)
	}
	if _, err := idem.NewOp[int, int](en.eng, "bad name!", func(context.Context, int) (int, error) { return 0, nil }, nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("bad op name: %v", err)
	}
	f := op.Func()
	if v, err := f(ctx, &chargeIn{OrderID: "o-1", Amount: 5}); err != nil || v != "ok-5 (replayed)" {
		t.Fatal(v, err)
	}
}

func TestOpWholePayloadKey(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	runs := 0
	op, err := idem.NewOp(en.eng, "notify", func(_ context.Context, in map[string]any) (int, error) { runs++; return len(in), nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []map[string]any{{"a": 1, "b": 2}, {"b": 2, "a": 1}} {
		if _, err := op.Do(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := op.Do(context.Background(), map[string]any{"a": 2}); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("ran %d times for 2 distinct payloads", runs)
	}
}

func TestStoredResultOfWrongTypeIsAnErrorNotGarbage(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	if _, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) { return "text", nil }); err != nil {
		t.Fatal(err)
	}
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("decoding a string result into int: %v, want ErrCorrupt", err)
	}
}

func TestCacheNeverSharesMutableValues(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Cache: &idem.CacheConfig{}})
	ctx := context.Background()
	fn := func(context.Context) (map[string]int, error) { return map[string]int{"n": 1}, nil }
	if _, err := idem.Do(ctx, en.eng, req("k"), fn); err != nil {
		t.Fatal(err)
	}
	r1, _ := idem.Do(ctx, en.eng, req("k"), fn)
	r1.Value["n"] = 99 // a caller scribbling on its copy
	r2, _ := idem.Do(ctx, en.eng, req("k"), fn)
	if r2.Value["n"] != 1 || !r2.Replayed {
		t.Fatalf("cache hit returned a value another caller mutated: %v", r2.Value)
	}
}

// An operation may complete its own record, in its own transaction
// (DoCompleting, as idempg.DoTx does): the engine encodes the value once,
// makes no Complete of its own, and replays the record.
func TestOperationCompletedItsOwnRecord(t *testing.T) {
	en := setup(t, idem.Config{RenewInterval: -1, Cache: &idem.CacheConfig{}})
	ctx := context.Background()
	codec := &countingCodec{}
	en.eng = en.another(t, idem.Config{RenewInterval: -1, Codec: codec, Observer: en.obs})
	res, err := idem.DoCompleting(ctx, en.eng, req("self"), func(ctx context.Context, c *idem.Completion[string]) (string, error) {
		p, err := c.Params("v")
		if err != nil {
			return "", err
		}
		return "v", en.mem.Complete(ctx, p) // the operation's own transaction
	})
	if err != nil || res.Value != "v" {
		t.Fatalf("DoCompleting: %+v, %v", res, err)
	}
	if n := en.store.Calls("complete"); n != 0 {
		t.Fatalf("engine made %d Complete calls for a self-completed record, want 0", n)
	}
	if codec.marshals.Load() != 1 {
		t.Fatalf("value encoded %d times, want once", codec.marshals.Load())
	}
	if n := en.obs.Count(observe.OutcomeCompleteFailed) + en.obs.Count(observe.OutcomeFenced); n != 0 {
		t.Fatalf("self-completed record counted %d failed/fenced writes", n)
	}
	again, err := idem.Do(ctx, en.eng, req("self"), func(context.Context) (string, error) { return "second", nil })
	if err != nil || !again.Replayed || again.Value != "v" {
		t.Fatalf("replay: %+v, %v", again, err)
	}
}

type countingCodec struct {
	idem.JSONCodec
	marshals atomic.Int32
}

func (c *countingCodec) Marshal(v any) ([]byte, error) {
	c.marshals.Add(1)
	return c.JSONCodec.Marshal(v)
}

func TestUncertainOutcomeKeepsTheClaimUntilItsLeaseEnds(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{Lease: 10 * time.Second, RenewInterval: -1})
	ctx := context.Background()
	sent := errors.New("request sent, no answer")
	runs := 0
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) {
		runs++
		return 0, idem.Uncertain(sent)
	})
	if !errors.Is(err, idem.ErrUncertain) || !errors.Is(err, sent) {
		t.Fatalf("first call: %v, want the uncertain error", err)
	}
	en.clock.Advance(9999 * time.Millisecond)
	_, err = idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { runs++; return 2, nil })
	if !errors.Is(err, idem.ErrInProgress) || runs != 1 {
		t.Fatalf("retry before the lease ended: %v, runs %d", err, runs)
	}
	en.clock.Advance(time.Millisecond)
	r, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { runs++; return 2, nil })
	if err != nil || r.Value != 2 || r.Fence != 2 || runs != 2 {
		t.Fatalf("retry after the lease: %+v %v, runs %d", r, err, runs)
	}
	if en.obs.Count(observe.OutcomeUncertain) != 1 || en.obs.Count(observe.OutcomeReleased) != 0 {
		t.Fatalf("observer: %v", en.obs.Snapshot())
	}
}

// TestDeadlineLeaseIsNotRenewed: a lease that runs to the context's deadline
// is final, so that a retry can take over as soon as the deadline passed
// (a Lambda invocation that timed out is ended there).
func TestDeadlineLeaseIsNotRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}, RenewInterval: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (int, error) {
			<-ctx.Done() // runs until the deadline
			return 0, idem.Uncertain(ctx.Err())
		})
		if !errors.Is(err, idem.ErrUncertain) {
			t.Fatal(err)
		}
		if n := en.store.Calls("extend"); n != 0 {
			t.Fatalf("%d renewals of a deadline lease", n)
		}
		r, err := idem.Do(context.Background(), en.eng, req("k"), func(context.Context) (int, error) { return 2, nil })
		if err != nil || r.Fence != 2 {
			t.Fatalf("retry right after the deadline: %+v %v", r, err)
		}
	})
}
