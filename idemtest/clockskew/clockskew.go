// Package clockskew runs two engines whose clocks disagree over one real
// store, and checks that leases are decided on the store's clock: an
// engine whose clock runs ahead is held off live work, one whose clock
// runs behind still takes over a lease that ended, and one beyond
// idem.Config.MaxClockOffset takes nothing over. Each store module runs it
// against its real server.
//
// It waits for real leases to pass (a second or two per case; the cases
// run in parallel): the store's clock is a real server's.
package clockskew

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/store"
)

// Timing of the cases: the holder's lease, renewed every Renew, and the
// operation, which outlives the lease, so only renewal keeps it. Two
// engines' corrected clocks may disagree by twice the error of a
// measurement (a second on DynamoDB, whose Date header tells whole
// seconds): the lease left at a renewal, Lease - Renew, covers that.
const (
	Lease     = 2 * time.Second
	Renew     = 200 * time.Millisecond
	Operation = 2500 * time.Millisecond
	// Slack is how long past a lease's end on the store's clock an
	// engine may still see it live: a measurement's error.
	Slack = 1200 * time.Millisecond
)

// Run runs every case against the store newStore returns (one store for
// both engines of a case). The store must implement store.ServerTimer.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	for name, off := range map[string]time.Duration{"45s": 45 * time.Second, "5m": 5 * time.Minute} {
		t.Run("AheadBy"+name+"/HeldOff", func(t *testing.T) {
			t.Parallel()
			ahead(t, newStore(t), off, true)
		})
	}
	t.Run("AheadBy45s/WithoutClockSync/RunsTwice", func(t *testing.T) {
		t.Parallel()
		ahead(t, newStore(t), 45*time.Second, false)
	})
	t.Run("BehindBy45s/TakesOverAnEndedLease", func(t *testing.T) {
		t.Parallel()
		behind(t, newStore(t), 45*time.Second, 0, true)
	})
	t.Run("BehindBy5m/WithinA10mBound/TakesOverAnEndedLease", func(t *testing.T) {
		t.Parallel()
		behind(t, newStore(t), 5*time.Minute, 10*time.Minute, true)
	})
	t.Run("BehindBy5m/BeyondTheBound/TakesNothingOver", func(t *testing.T) {
		t.Parallel()
		behind(t, newStore(t), 5*time.Minute, 0, false)
	})
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEngine(t *testing.T, s store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	if _, ok := s.(store.ServerTimer); !ok {
		t.Fatalf("store %T does not tell its time (store.ServerTimer)", s)
	}
	cfg.Logger = quiet()
	cfg.Lease, cfg.RenewInterval = Lease, Renew
	e, err := idem.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func request(t *testing.T) idem.Request {
	return idem.Request{Operation: "clockskew", Key: fmt.Sprintf("%s/%x", t.Name(), rand.Uint64()), Payload: []byte(`{"amount":100}`)}
}

// ahead: engine A (the system clock) runs an operation longer than its
// lease, renewing it; engine B, its clock off ahead, calls the same key
// meanwhile, again and again. With B measuring the store's clock (sync),
// B is held off every time, the operation runs once, and B's call after
// it replays A's result. Without (the engines' clocks decide), B takes
// the live claim over: the failure this package guards against.
func ahead(t *testing.T, s store.Store, off time.Duration, sync bool) {
	a := newEngine(t, s, idem.Config{})
	bcfg := idem.Config{Clock: clocktest.NewSkewed(off), ClockSync: 10 * time.Second}
	if !sync {
		bcfg.ClockSync = -1
	}
	b := newEngine(t, s, bcfg)
	req := request(t)
	ctx := context.Background()
	var runs atomic.Int32
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		res, err := idem.Do(ctx, a, req, func(context.Context) (string, error) {
			runs.Add(1)
			close(started)
			time.Sleep(Operation) // the operation's real work: leases pass on the store's clock
			return "from-a", nil
		})
		if err == nil && (res.Value != "from-a" || res.Replayed) {
			err = fmt.Errorf("the first engine's call: %+v", res)
		}
		done <- err
	}()
	<-started
	tick := time.NewTicker(Lease / 4)
	defer tick.Stop()
	var heldOff, took int
	for end := time.After(Operation - Lease/4); ; {
		select {
		case <-tick.C:
			_, err := idem.Do(ctx, b, req, func(context.Context) (string, error) { runs.Add(1); return "from-b", nil })
			switch {
			case errors.Is(err, idem.ErrInProgress):
				heldOff++
			case err == nil:
				took++
			default:
				t.Fatalf("B's call during A's operation: %v", err)
			}
			continue
		case <-end:
		}
		break
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !sync {
		if took == 0 {
			t.Fatalf("without ClockSync, B (%v ahead) never took the claim over; the case shows nothing", off)
		}
		return
	}
	if took != 0 || runs.Load() != 1 || heldOff == 0 {
		t.Fatalf("B (%v ahead) took the live claim over %d times (held off %d); the operation ran %d times, want once", off, took, heldOff, runs.Load())
	}
	res, err := idem.Do(ctx, b, req, func(context.Context) (string, error) { runs.Add(1); return "from-b", nil })
	if err != nil || !res.Replayed || res.Value != "from-a" {
		t.Fatalf("B's call after A's: %+v %v; want A's result replayed", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("the operation ran %d times, want once", runs.Load())
	}
}

// behind: engine A claims the key for a short while and goes away (a
// token never settled, its lease not renewed); once the lease has ended
// on the store's clock, engine B, its clock off behind, calls the key.
// Within the bound (default 1m, or bound) it takes the claim over and
// runs the operation; beyond it, it takes nothing over.
func behind(t *testing.T, s store.Store, off, bound time.Duration, within bool) {
	a := newEngine(t, s, idem.Config{})
	b := newEngine(t, s, idem.Config{Clock: clocktest.NewSkewed(-off), ClockSync: 10 * time.Second, MaxClockOffset: bound})
	req := request(t)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	bg, err := a.Begin(ctx, req, &idem.BeginOptions{ExpectedCompletion: lease})
	if err != nil || !bg.Acquired {
		t.Fatalf("A's claim: %+v %v", bg, err)
	}
	time.Sleep(lease + Slack) // A's lease really ends, on the store's clock, by more than B's error
	ran := false
	res, err := idem.Do(ctx, b, req, func(context.Context) (string, error) { ran = true; return "from-b", nil })
	switch {
	case within && (err != nil || !ran || res.Value != "from-b"):
		t.Fatalf("B (%v behind) on a lease that ended on the store's clock: %+v %v, ran %v; want it taken over", off, res, err, ran)
	case !within && (!errors.Is(err, idem.ErrInProgress) || ran):
		t.Fatalf("B (%v behind, beyond MaxClockOffset) on an ended lease: %+v %v, ran %v; want it held off", off, res, err, ran)
	}
}

// ServerTime checks that st tells the server's own clock, on a server of
// this machine: the local time when it answered, within the round trip
// and half the clock's resolution (0 for a clock read to the
// microsecond, a second for DynamoDB's Date header) plus 50ms.
func ServerTime(t *testing.T, st store.ServerTimer, resolution time.Duration) {
	t.Helper()
	slack := resolution/2 + 50*time.Millisecond
	before := time.Now()
	got, err := st.ServerTime(context.Background())
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if got.Before(before.Add(-slack)) || got.After(after.Add(slack)) {
		t.Fatalf("ServerTime %v, want within %v of %v .. %v (one machine)", got, slack, before, after)
	}
}
