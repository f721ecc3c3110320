// Tests of the claim round: in progress, in-process flights, waiting, the
// local cache.

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
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

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
	if !ipe.LeaseUntil.Equal(t0.Add(20*time.Second)) || !ipe.Since.Equal(t0) {
		t.Fatalf("lease end %v, claimed at %v", ipe.LeaseUntil, ipe.Since)
	}
	// Told to come back after as long again as the holder has run, at least
	// 100ms, at most until its lease ends.
	for _, c := range []struct{ at, want time.Duration }{
		{0, 100 * time.Millisecond}, {3 * time.Second, 3 * time.Second}, {15 * time.Second, 5 * time.Second},
		{20 * time.Second, 100 * time.Millisecond},
	} {
		if got := ipe.RetryAfter(t0.Add(c.at)); got != c.want {
			t.Errorf("retry-after at %v: %v, want %v", c.at, got, c.want)
		}
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

func TestLocalCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	en := setup(t, idem.Config{Expiry: time.Hour, CacheEntries: 2})
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

func TestCacheNeverSharesMutableValues(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{CacheEntries: 10_000})
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
