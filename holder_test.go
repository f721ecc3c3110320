// Tests of the holder: the error policy, takeover and fencing, leases and
// their renewal, outcomes over the limits.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

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
	var fe *store.FencedError
	if err := <-cause; !errors.Is(err, idem.ErrLeaseLost) || !errors.As(err, &fe) || fe.Current != 2 {
		t.Fatalf("operation context cause: %v, want ErrLeaseLost wrapping the store's *FencedError", err)
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

// TestDeadlineLeaseIsRenewedWhileTheOperationRuns: a caller's deadline
// sets the first lease only. An operation that runs on after it (most
// handlers do not stop when their context ends) keeps its claim, renewed,
// so a retry at another engine on the same store is held off instead of
// running it again, and gets the outcome once it is stored.
func TestDeadlineLeaseIsRenewedWhileTheOperationRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		other := en.another(t, idem.Config{})
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		var runs atomic.Int32
		done := make(chan error)
		go func() {
			r, err := idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (int, error) {
				runs.Add(1)
				time.Sleep(800 * time.Millisecond) // runs on past its caller's deadline
				return 1, nil
			})
			if err == nil && (r.Value != 1 || r.Replayed) {
				err = fmt.Errorf("first call: %+v", r)
			}
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // the deadline has passed, the operation runs on
		_, err := idem.Do(context.Background(), other, req("k"), func(context.Context) (int, error) { runs.Add(1); return 2, nil })
		var ipe *idem.InProgressError
		if !errors.As(err, &ipe) || runs.Load() != 1 {
			t.Fatalf("retry at another engine after the deadline: %v, runs %d", err, runs.Load())
		}
		// As long again as the operation has run (500ms), at most until the
		// renewed lease ends (the deadline's 300ms, renewed every 100ms: 200 to
		// 300ms away).
		if got, left := ipe.RetryAfter(time.Now()), time.Until(ipe.LeaseUntil); got != min(500*time.Millisecond, left) || got < 200*time.Millisecond {
			t.Fatalf("retry told to come back after %v (lease ends in %v)", got, left)
		}
		if left := ipe.LeaseUntil.Sub(start); left <= 500*time.Millisecond {
			t.Fatalf("lease ends %v after the claim, want it renewed past the deadline", left)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Renewed every third of the deadline's 300ms from the start, until
		// the operation returned at 800ms.
		if n := en.store.Calls("extend"); n < 6 || n > 8 {
			t.Fatalf("%d renewals in 800ms at 100ms intervals", n)
		}
		r, err := idem.Do(context.Background(), other, req("k"), func(context.Context) (int, error) { runs.Add(1); return 2, nil })
		if err != nil || !r.Replayed || r.Value != 1 || runs.Load() != 1 {
			t.Fatalf("retry after the outcome: %+v %v, runs %d", r, err, runs.Load())
		}
	})
}

// TestFarDeadlineIsRenewedFromOneLeaseBeforeIt: a deadline further off than
// Config.Lease is the claim's first lease, with no renewal until it has
// less than a lease left; from then the lease is renewed to now + Lease,
// past the deadline while the operation runs on, and never moved back.
func TestFarDeadlineIsRenewedFromOneLeaseBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}, Lease: 30 * time.Second, RenewInterval: 10 * time.Second})
		other := en.another(t, idem.Config{Lease: 30 * time.Second})
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		done := make(chan error)
		go func() {
			_, err := idem.Do(ctx, en.eng, req("k"), func(ctx context.Context) (int, error) {
				time.Sleep(11 * time.Minute)
				return 1, nil
			})
			done <- err
		}()
		time.Sleep(9*time.Minute + 35*time.Second)
		if n := en.store.Calls("extend"); n != 0 {
			t.Fatalf("%d renewals while the deadline was more than a lease less an interval away", n)
		}
		time.Sleep(10*time.Minute + 30*time.Second - 9*time.Minute - 35*time.Second) // 30s past the deadline
		_, err := idem.Do(context.Background(), other, req("k"), func(context.Context) (int, error) { return 2, nil })
		var ipe *idem.InProgressError
		if !errors.As(err, &ipe) {
			t.Fatalf("retry 30s past the deadline: %v, want in progress", err)
		}
		if until := ipe.LeaseUntil.Sub(start); until < 10*time.Minute+50*time.Second || until > 11*time.Minute {
			t.Fatalf("lease until %v after the claim, want within a lease of now (10m30s)", until)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// From 9m40s (a lease less an interval before the deadline) every
		// 10s until the operation returned at 11m.
		if n := en.store.Calls("extend"); n < 8 || n > 9 {
			t.Fatalf("%d renewals, want those from 9m40s to 11m at 10s intervals", n)
		}
	})
}

// TestEndsAtDeadlineLeaseIsNotRenewed: a context marked EndsAtDeadline (an
// AWS Lambda invocation, ended at its deadline) keeps the deadline as its
// lease, so that a retry can take over as soon as the deadline passed.
func TestEndsAtDeadlineLeaseIsNotRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}, RenewInterval: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := idem.Do(idem.EndsAtDeadline(ctx), en.eng, req("k"), func(ctx context.Context) (int, error) {
			<-ctx.Done() // runs until the deadline
			return 0, idem.Uncertain(ctx.Err())
		})
		if !errors.Is(err, idem.ErrUncertain) {
			t.Fatal(err)
		}
		if n := en.store.Calls("extend"); n != 0 {
			t.Fatalf("%d renewals of a lease whose holder ends at the deadline", n)
		}
		r, err := idem.Do(context.Background(), en.eng, req("k"), func(context.Context) (int, error) { return 2, nil })
		if err != nil || r.Fence != 2 {
			t.Fatalf("retry right after the deadline: %+v %v", r, err)
		}
	})
}

// A terminal error whose code or message is not UTF-8 (an error that
// wraps a binary reply) is stored with each such byte as U+FFFD: every
// store keeps an error's text as text and refuses other bytes
// (store.FailParams.Check), so storing it as it is would fail, and the key
// would be run again after its lease. Its body stays bytes.
func TestTerminalErrorWithBinaryTextIsStored(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	fn := func(context.Context) (string, error) {
		return "", &idem.TerminalError{Code: "up\xffstream", Message: "reply \xfe\xff", Body: []byte{0xff, 0}}
	}
	_, err := idem.Do(ctx, en.eng, req("binary"), fn)
	var te *idem.TerminalError
	if !errors.As(err, &te) {
		t.Fatalf("first call: %v, want its terminal error", err)
	}
	_, err = idem.Do(ctx, en.eng, req("binary"), fn)
	if !errors.As(err, &te) || !te.Replayed || te.Code != "up\uFFFDstream" || te.Message != "reply \uFFFD" || string(te.Body) != "\xff\x00" {
		t.Fatalf("replay: %#v, want the error with U+FFFD for the invalid bytes and the body as it was", err)
	}
}
