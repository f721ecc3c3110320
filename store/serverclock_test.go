package store_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// timer is a store whose clock is off the system clock by off, and
// counts its measurements; err fails them.
type timer struct {
	off   time.Duration
	calls atomic.Int32
	err   error
}

func (s *timer) ServerTime(context.Context) (time.Time, error) {
	s.calls.Add(1)
	if s.err != nil {
		return time.Time{}, s.err
	}
	return time.Now().Add(s.off), nil
}

func near(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Fatalf("%s: %v, want %v (off by %v)", what, got, want, d)
	}
}

func TestServerClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("AheadOfTheStoreReadsTheStoresTime", func(t *testing.T) {
		t.Parallel()
		st := &timer{}
		local := clocktest.NewSkewed(5 * time.Minute)
		c := store.NewServerClock(st, local)
		if !c.Corrected() {
			t.Fatal("a real-time clock over a store that tells its time is not corrected")
		}
		near(t, "Now before Sync", c.Now(), time.Now().Add(5*time.Minute))
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		near(t, "Now after Sync", c.Now(), time.Now())
		// A step of the local wall clock changes nothing: elapsed time
		// is the process's monotonic clock.
		local.Step(-10 * time.Minute)
		near(t, "Now after a step", c.Now(), time.Now())
		if err := c.Sync(ctx); err != nil || st.calls.Load() != 1 {
			t.Fatalf("a second Sync within the interval: %v, %d measurements, want 1", err, st.calls.Load())
		}
	})
	t.Run("BehindTheStoreReadsTheStoresTime", func(t *testing.T) {
		t.Parallel()
		c := store.NewServerClock(&timer{off: 3 * time.Minute}, clocktest.NewSkewed(-2*time.Minute))
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		near(t, "Now", c.Now(), time.Now().Add(3*time.Minute))
	})
	t.Run("AStoreWithoutAClockIsTheLocalClock", func(t *testing.T) {
		t.Parallel()
		s := memstore.New(&memstore.Config{SweepInterval: -1})
		defer s.Close()
		c := store.NewServerClock(s, clocktest.NewSkewed(5*time.Minute))
		if err := c.Sync(ctx); err != nil || c.Corrected() {
			t.Fatalf("Sync %v, Corrected %v: memstore tells no time", err, c.Corrected())
		}
		near(t, "Now", c.Now(), time.Now().Add(5*time.Minute))
	})
	t.Run("AManualClockOwnsTime", func(t *testing.T) {
		t.Parallel()
		start := time.Now().Add(time.Hour).Truncate(time.Millisecond)
		manual := clocktest.New(start)
		st := &timer{}
		c := store.NewServerClock(st, manual)
		if err := c.Sync(ctx); err != nil || c.Corrected() || st.calls.Load() != 0 {
			t.Fatalf("Sync %v, Corrected %v, %d measurements: a manual clock is not corrected", err, c.Corrected(), st.calls.Load())
		}
		manual.Advance(time.Minute)
		if got := c.Now(); !got.Equal(start.Add(time.Minute)) {
			t.Fatalf("Now %v, want the manual clock's %v", got, start.Add(time.Minute))
		}
	})
	t.Run("ConcurrentSyncsMeasureOnce", func(t *testing.T) {
		t.Parallel()
		st := &timer{off: time.Minute}
		c := store.NewServerClock(st, nil)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				if err := c.Sync(ctx); err != nil {
					t.Error(err)
				}
				_ = c.Now()
			})
		}
		wg.Wait()
		if n := st.calls.Load(); n != 1 {
			t.Fatalf("32 concurrent Syncs measured %d times, want once", n)
		}
		near(t, "Now", c.Now(), time.Now().Add(time.Minute))
	})
	t.Run("AFailedMeasurementIsAnError", func(t *testing.T) {
		t.Parallel()
		c := store.NewServerClock(&timer{err: store.ErrUnavailable}, nil)
		if err := c.Sync(ctx); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Sync: %v, want ErrUnavailable", err)
		}
	})
	t.Run("CorrectingACorrectedClockStartsFromItsBase", func(t *testing.T) {
		t.Parallel()
		st := &timer{off: -time.Minute}
		a := store.NewServerClock(st, clocktest.NewSkewed(time.Hour))
		if err := a.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		b := store.NewServerClock(&timer{off: time.Minute}, a)
		near(t, "Now before Sync", b.Now(), time.Now().Add(time.Hour))
		if err := b.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		near(t, "Now", b.Now(), time.Now().Add(time.Minute))
	})
}
