package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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

// timedStore is a memstore with a clock of its own, a fake of a server's
// (store.ServerTimer): the process's clock (fake time in a synctest
// bubble) plus off. fail makes ServerTime fail, rtt makes it take that
// long, reading the clock halfway.
type timedStore struct {
	*memstore.Store
	off   atomic.Int64
	fail  atomic.Bool
	rtt   time.Duration
	calls atomic.Int64
}

func newTimedStore(t *testing.T) *timedStore {
	m := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = m.Close() })
	return &timedStore{Store: m}
}

// now is the store's clock.
func (s *timedStore) now() time.Time { return time.Now().Add(time.Duration(s.off.Load())) }

func (s *timedStore) ServerTime(ctx context.Context) (time.Time, error) {
	s.calls.Add(1)
	time.Sleep(s.rtt / 2) // the request's way there; the server reads its clock; the reply's way back
	now := s.now()
	time.Sleep(s.rtt / 2)
	if s.fail.Load() {
		return time.Time{}, fmt.Errorf("time: %w", store.ErrUnavailable)
	}
	return now, nil
}

// clockObs records the engine's clock measurements.
type clockObs struct {
	observe.Counters
	mu   sync.Mutex
	seen []observe.ClockSync
}

func (o *clockObs) ClockSync(s observe.ClockSync) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, s)
}

func (o *clockObs) last() observe.ClockSync {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) == 0 {
		return observe.ClockSync{Err: errors.New("no measurement")}
	}
	return o.seen[len(o.seen)-1]
}

// skewedEngine is an engine over s whose clock is off the store's by off
// (the system clock, or synctest's, shifted), measuring the store's clock
// every 10s.
func skewedEngine(t *testing.T, s store.Store, off time.Duration, cfg idem.Config) (*idem.Engine, *clockObs) {
	t.Helper()
	obs := &clockObs{}
	if cfg.Clock == nil {
		cfg.Clock = clocktest.NewSkewed(off)
	}
	if cfg.ClockSync == 0 {
		cfg.ClockSync = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Observer = obs
	e, err := idem.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, obs
}

// holdAt makes another holder's claim of key on s, at the store's now,
// whose lease ends at now + lease (negative: it has ended).
func holdAt(t *testing.T, s *timedStore, key string, lease time.Duration) {
	t.Helper()
	r := req(key)
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	now := store.Millis(s.now())
	res, err := s.Claim(context.Background(), store.ClaimParams{Key: id.StoreKey.String(), Fingerprint: "v1:" + id.Fingerprint, Owner: "other-process",
		Now: now - 1, LeaseUntil: now + lease.Milliseconds(), ExpiresAt: now + time.Hour.Milliseconds()})
	if err != nil || !res.Acquired {
		t.Fatalf("holder's claim: %+v %v", res, err)
	}
}

// tryRun calls key on e and reports whether the operation ran (true), or
// the key was held (false).
func tryRun(t *testing.T, e *idem.Engine, key string) bool {
	t.Helper()
	ran := false
	_, err := idem.Do(context.Background(), e, req(key), func(context.Context) (string, error) { ran = true; return "ok", nil })
	switch {
	case err == nil:
		return ran
	case errors.Is(err, idem.ErrInProgress):
		return false
	}
	t.Fatalf("Do(%s): %v", key, err)
	return false
}

// Every timestamp the engine writes and compares is on the store's clock,
// whatever the engine's own says; the store is asked once per interval.
func TestClockSyncCorrectsToTheStoresClock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTimedStore(t)
		e, obs := skewedEngine(t, s, 45*time.Second, idem.Config{})
		tryRun(t, e, "k1")
		r1 := req("k1")
		id, _ := r1.Identity()
		r, err := s.Get(context.Background(), id.StoreKey.String())
		if err != nil {
			t.Fatal(err)
		}
		now := store.Millis(s.now())
		if r.CreatedAt != now || r.CompletedAt != now || r.ExpiresAt != now+time.Hour.Milliseconds() {
			t.Fatalf("record created %d completed %d expires %d; want the store's now %d (and +1h)", r.CreatedAt, r.CompletedAt, r.ExpiresAt, now)
		}
		if got := e.Now(); !got.Equal(s.now()) {
			t.Fatalf("Now() = %v, want the store's %v", got, s.now())
		}
		if got, want := e.Config().Clock.Now(), s.now().Add(45*time.Second); !got.Equal(want) {
			t.Fatalf("Config().Clock.Now() = %v, want the configured clock's %v, uncorrected", got, want)
		}
		if got := obs.last(); got.Err != nil || got.Offset != -45*time.Second || !got.Trusted {
			t.Fatalf("measurement %+v; want offset -45s, trusted", got)
		}
		for i := range 5 {
			tryRun(t, e, fmt.Sprint("more", i))
		}
		if n := s.calls.Load(); n != 1 {
			t.Fatalf("the store's clock was read %d times within one interval, want once", n)
		}
		time.Sleep(10 * time.Second)
		tryRun(t, e, "k2")
		if n := s.calls.Load(); n != 2 {
			t.Fatalf("after an interval the store's clock was read %d times in all, want 2", n)
		}
	})
}

// Two engines, one 45s ahead of the store and one 45s behind: the one
// ahead is held off a lease that is live on the store's clock, the one
// behind takes over a lease that ended on it. Without the measurement
// (ClockSync off) each decides on its own clock, wrongly.
func TestClockSyncDecidesLeasesOnTheStoresClock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		off   time.Duration // engine clock minus store clock
		lease time.Duration // the other holder's lease from the store's now
		sync  bool
	}{
		{"ahead, live lease: held off", 45 * time.Second, 10 * time.Second, true},
		{"behind, ended lease: taken over", -45 * time.Second, -time.Millisecond, true},
		{"ahead, no sync: runs twice", 45 * time.Second, 10 * time.Second, false},
		{"behind, no sync: stuck", -45 * time.Second, -time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				s := newTimedStore(t)
				cfg := idem.Config{}
				if !c.sync {
					cfg.ClockSync = -1
				}
				e, _ := skewedEngine(t, s, c.off, cfg)
				holdAt(t, s, "k", c.lease)
				ran := tryRun(t, e, "k")
				truly := c.lease < 0 // the lease ended on the store's clock
				if c.sync && ran != truly {
					t.Fatalf("ran %v; the lease ended on the store's clock: %v", ran, truly)
				}
				if !c.sync && ran == truly {
					t.Fatalf("without the measurement: ran %v; the engine's own clock should have decided wrongly", ran)
				}
			})
		})
	}
}

// An engine whose offset to the store is beyond MaxClockOffset still
// corrects its timestamps, but takes nothing over: it logs it and tells
// the observer. Within a larger bound it takes over again.
func TestClockSyncBeyondTheBoundTakesNothingOver(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTimedStore(t)
		var logs bytes.Buffer
		far, obs := skewedEngine(t, s, -5*time.Minute, idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		holdAt(t, s, "k", -time.Millisecond)
		if tryRun(t, far, "k") {
			t.Fatal("an engine 5 min off the store (bound 1m) took a claim over")
		}
		if got := obs.last(); got.Err != nil || got.Offset != 5*time.Minute || got.Trusted {
			t.Fatalf("measurement %+v; want offset +5m, not trusted", got)
		}
		if !bytes.Contains(logs.Bytes(), []byte("MaxClockOffset")) || !bytes.Contains(logs.Bytes(), []byte("offset=5m0s")) {
			t.Fatalf("no warning about the offset; logs:\n%s", logs.String())
		}
		wide, obs := skewedEngine(t, s, -5*time.Minute, idem.Config{MaxClockOffset: 10 * time.Minute})
		if !tryRun(t, wide, "k") {
			t.Fatal("within MaxClockOffset 10m the lease that ended on the store's clock was not taken over")
		}
		if got := obs.last(); !got.Trusted {
			t.Fatalf("measurement %+v; want trusted", got)
		}
	})
}

// Until the store has told its time, and once its last answer is three
// intervals old, the engine takes nothing over; a store that cannot be
// asked is asked again after an interval, not on every call.
func TestClockSyncUnknownOrStaleTakesNothingOver(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTimedStore(t)
		s.fail.Store(true)
		e, obs := skewedEngine(t, s, 0, idem.Config{})
		holdAt(t, s, "k1", -time.Millisecond)
		for range 2 {
			if tryRun(t, e, "k1") {
				t.Fatal("took a claim over before the store's clock was known")
			}
		}
		if n := s.calls.Load(); n != 1 {
			t.Fatalf("a failing store was asked its time %d times within one interval, want once", n)
		}
		if got := obs.last(); got.Err == nil || got.Trusted {
			t.Fatalf("measurement %+v; want the store's error, not trusted", got)
		}
		s.fail.Store(false)
		time.Sleep(10 * time.Second)
		if !tryRun(t, e, "k1") {
			t.Fatal("the store's clock known again: the ended lease was not taken over")
		}

		// The store stops answering: the last measurement stands for
		// three intervals, then is stale.
		s.fail.Store(true)
		time.Sleep(10 * time.Second)
		holdAt(t, s, "k2", -time.Millisecond)
		if !tryRun(t, e, "k2") {
			t.Fatal("one failed measurement after a good one: the ended lease was not taken over")
		}
		time.Sleep(25 * time.Second)
		holdAt(t, s, "k3", -time.Millisecond)
		if tryRun(t, e, "k3") {
			t.Fatal("the last measurement 35s old (three intervals: 30s): a claim was taken over")
		}
	})
}

// Concurrent first calls ask the store's time once, and the others wait
// for that answer: every claim is on the store's clock, none on the
// engine's own (45s ahead).
func TestClockSyncMeasuresOneAtATime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTimedStore(t)
		s.rtt = 5 * time.Millisecond
		e, _ := skewedEngine(t, s, 45*time.Second, idem.Config{})
		start := store.Millis(s.now())
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() { tryRun(t, e, fmt.Sprint("k", i)) })
		}
		wg.Wait()
		if n := s.calls.Load(); n != 1 {
			t.Fatalf("20 concurrent first calls asked the store's time %d times, want 1", n)
		}
		end := store.Millis(s.now())
		for i := range 20 {
			r := req(fmt.Sprint("k", i))
			id, _ := r.Identity()
			rec, err := s.Get(context.Background(), id.StoreKey.String())
			if err != nil {
				t.Fatal(err)
			}
			if rec.CreatedAt < start || rec.CreatedAt > end {
				t.Fatalf("claim %d made at %d, outside the store's %d..%d: not on the store's clock", i, rec.CreatedAt, start, end)
			}
		}
	})
}

// A step of the engine's wall clock between measurements (its monotonic
// clock running true) does not move the corrected time; the next claim
// asks the store again, and a step beyond the bound holds takeovers off.
// Real time: synctest's times carry no monotonic reading. Nothing sleeps.
func TestClockSyncStepOfTheWallClock(t *testing.T) {
	t.Parallel()
	s := newTimedStore(t)
	clk := clocktest.NewSkewed(0)
	e, obs := skewedEngine(t, s, 0, idem.Config{Clock: clk})
	tryRun(t, e, "k1")
	near := func(what string) {
		t.Helper()
		if d := time.Until(e.Now()); d > 500*time.Millisecond || d < -500*time.Millisecond {
			t.Fatalf("%s: corrected time off the store's by %v", what, d)
		}
	}
	near("in step")
	clk.Step(45 * time.Second)
	near("after a 45s step, before the store is asked again")
	tryRun(t, e, "k2")
	if n := s.calls.Load(); n != 2 {
		t.Fatalf("after a step the store's clock was read %d times in all, want 2", n)
	}
	if got := obs.last(); !got.Trusted || got.Offset > -44*time.Second || got.Offset < -46*time.Second {
		t.Fatalf("after a 45s step: measurement %+v, want offset -45s, trusted", got)
	}
	near("after the new measurement")
	clk.Step(5 * time.Minute)
	holdAt(t, s, "k3", -time.Millisecond)
	if tryRun(t, e, "k3") {
		t.Fatal("after a step to 5m45s off the store, a claim was taken over")
	}
	near("5m45s off")
}

// Stores that run in the caller's process are never measured; an
// injected clock is measured only when asked; the corrected clock costs
// no allocation.
func TestClockSyncDefaults(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	e, err := idem.New(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Config().Clock.(store.SystemClock); !ok || e.Config().ClockSync != 10*time.Second || e.Config().MaxClockOffset != time.Minute {
		t.Fatalf("memstore engine: clock %T, ClockSync %v, MaxClockOffset %v; want the system clock, 10s, 1m",
			e.Config().Clock, e.Config().ClockSync, e.Config().MaxClockOffset)
	}
	s := newTimedStore(t)
	manual := clocktest.New(t0)
	e, err = idem.New(s, &idem.Config{Clock: manual})
	if err != nil {
		t.Fatal(err)
	}
	tryRun(t, e, "k")
	if e.Config().Clock != manual || e.Config().ClockSync >= 0 || s.calls.Load() != 0 {
		t.Fatalf("injected clock: Config().Clock %T, ClockSync %v, %d measurements; want it as given, off, none", e.Config().Clock, e.Config().ClockSync, s.calls.Load())
	}
	e, err = idem.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	tryRun(t, e, "k2")
	if s.calls.Load() != 1 {
		t.Fatalf("system clock over a store that tells its time: %d measurements, want 1", s.calls.Load())
	}
	again, err := idem.New(s, new(e.Config()))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := again.Config().Clock.(store.SystemClock); !ok {
		t.Fatalf("an engine built from another's Config: Config().Clock is %T, want the configured store.SystemClock", again.Config().Clock)
	}
	tryRun(t, again, "k3")
	if got := time.Until(again.Now()); got > time.Second || got < -time.Second || s.calls.Load() != 2 {
		t.Fatalf("an engine built from another's Config: corrected clock off by %v after %d measurements in all, want its own (2)", got, s.calls.Load())
	}
	for _, bad := range []idem.Config{{ClockSync: time.Millisecond}, {MaxClockOffset: -time.Second}} {
		if _, err := idem.New(s, &bad); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// The corrected clock costs no allocation.
func TestClockSyncNowAllocatesNothing(t *testing.T) {
	s := newTimedStore(t)
	e, err := idem.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	tryRun(t, e, "k")
	if n := testing.AllocsPerRun(100, func() { _ = e.Now() }); n != 0 {
		t.Fatalf("corrected Now allocates %v times, want 0", n)
	}
}

// A call that ends, or whose short deadline cuts the measurement off, is
// no fault of the store's: the next call measures at once, instead of the
// engine waiting out an interval on its own clock.
func TestClockSyncCallerDeadlineIsNotAStoreFault(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTimedStore(t)
		s.rtt = 10 * time.Millisecond
		e, obs := skewedEngine(t, s, 45*time.Second, idem.Config{})
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := idem.Do(ended, e, req("k1"), func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("call with an ended context: %v", err)
		}
		short, cancel := context.WithTimeout(context.Background(), 4*time.Millisecond)
		defer cancel()
		_, _ = idem.Do(short, e, req("k2"), func(context.Context) (int, error) { return 1, nil })
		holdAt(t, s, "k3", -time.Millisecond)
		if !tryRun(t, e, "k3") {
			t.Fatal("after calls cut short, the next call did not measure and take the ended lease over")
		}
		if got := obs.last(); got.Err != nil || !got.Trusted || got.Offset != -45*time.Second {
			t.Fatalf("measurement %+v; want -45s, trusted", got)
		}
	})
}
