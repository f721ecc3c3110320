package idem_test

import (
	"context"
	"errors"
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

// holdEnv is two engines (two processes) over one memstore, in a
// synctest bubble's time.
type holdEnv struct {
	mem        *memstore.Store
	first, rtr *idem.Engine // rtr: another process, with the default policy
	obs        *observe.Counters
}

func newHoldEnv(t *testing.T, cfg idem.Config) *holdEnv {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Logger = quiet
	first, err := idem.New(mem, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs := &observe.Counters{}
	rtr, err := idem.New(mem, &idem.Config{Lease: cfg.Lease, Expiry: cfg.Expiry, Wait: 3 * time.Second, Logger: quiet, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return &holdEnv{mem: mem, first: first, rtr: rtr, obs: obs}
}

// A holder that dies under the Hold policy (a Begin whose work never
// reports: its expected completion passes unrenewed) leaves its key held:
// a later call, from another process with the default policy and a wait
// budget, gets a *HeldError at once (not ErrInProgress) and does not run
// the operation; the record stays IN_PROGRESS with the holder's claim. A
// reconciler settles it with the State's token (Release here), and the
// next call runs. Under Rerun the same death is a takeover.
func TestHoldCrashedKeyWaitsForAPerson(t *testing.T) {
	for _, hold := range []bool{true, false} {
		name := map[bool]string{true: "Hold", false: "Rerun"}[hold]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				en := newHoldEnv(t, idem.Config{Lease: 2 * time.Second, Expiry: time.Hour})
				ctx := context.Background()
				r := req("crash")
				r.HoldCrashed = hold
				b, err := en.first.Begin(ctx, r, &idem.BeginOptions{ExpectedCompletion: 2 * time.Second})
				if err != nil || !b.Acquired {
					t.Fatalf("Begin: %+v %v", b, err)
				}
				time.Sleep(2 * time.Second) // the holder is gone: its lease passes
				var runs atomic.Int32
				fn := func(context.Context) (int, error) { runs.Add(1); return 7, nil }
				start := time.Now()
				res, err := idem.Do(ctx, en.rtr, req("crash"), fn)
				if !hold {
					if err != nil || res.Fence != 2 || runs.Load() != 1 || en.obs.Count(observe.OutcomeTakeover) != 1 {
						t.Fatalf("Rerun after the lease: %+v %v runs %d; want a takeover that runs", res, err, runs.Load())
					}
					return
				}
				var he *idem.HeldError
				if !errors.As(err, &he) || !errors.Is(err, idem.ErrHeld) || errors.Is(err, idem.ErrInProgress) {
					t.Fatalf("after the lease: %v; want a *HeldError matching ErrHeld, not ErrInProgress", err)
				}
				if waited := time.Since(start); waited != 0 {
					t.Errorf("a held key was waited for (%v); it waits for a person", waited)
				}
				if he.Owner != b.State.Owner || !he.LeaseUntil.Equal(b.State.LeaseUntil) || !he.Since.Equal(b.State.CreatedAt) {
					t.Errorf("HeldError %+v; want the lost holder's claim %+v", he, b.State)
				}
				if runs.Load() != 0 || en.obs.Count(observe.OutcomeHeld) != 1 || en.obs.Count(observe.OutcomeTakeover) != 0 {
					t.Fatalf("runs %d, observer %v; want no run, one held", runs.Load(), en.obs.Snapshot())
				}
				rec, err := en.mem.Get(ctx, b.State.Key)
				if err != nil || rec.Status != store.StatusInProgress || rec.Fence != 1 || !rec.Hold {
					t.Fatalf("record %+v %v; want the held IN_PROGRESS claim, fence 1", rec, err)
				}
				// A reconciler reads the record and settles it with its token.
				st, err := en.rtr.Status(ctx, b.Token.Key)
				if err != nil || !st.Hold || st.Status != idem.StatusInProgress {
					t.Fatalf("Status: %+v %v; want IN_PROGRESS with Hold", st, err)
				}
				if err := en.rtr.Release(ctx, st.Token()); err != nil {
					t.Fatalf("releasing the held key: %v", err)
				}
				if res, err := idem.Do(ctx, en.rtr, req("crash"), fn); err != nil || res.Replayed || runs.Load() != 1 {
					t.Fatalf("after the release: %+v %v runs %d; want one run", res, err, runs.Load())
				}
			})
		})
	}
}

// The policy comes from Config, OpConfig or the Request, whichever sets
// it; a held key whose holder is alive but stopped renewing (RenewInterval
// < 0) still takes its holder's outcome when it comes, and calls then get
// the replay. A held key counts as absent at its expiry, as any record,
// and then runs again.
func TestHoldPolicySourcesAndLateHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			name string
			cfg  idem.Config
			op   idem.OpConfig[int, int]
		}{
			{"Config", idem.Config{HoldCrashed: true}, idem.OpConfig[int, int]{}},
			{"OpConfig", idem.Config{}, idem.OpConfig[int, int]{HoldCrashed: true}},
		} {
			c.cfg.Lease, c.cfg.RenewInterval, c.cfg.Expiry = 2*time.Second, -1, time.Minute
			en := newHoldEnv(t, c.cfg)
			ctx := context.Background()
			inside, finish := make(chan struct{}), make(chan struct{})
			op, err := idem.NewOp(en.first, "charge", func(ctx context.Context, in int) (int, error) {
				close(inside)
				<-finish
				return in * 2, nil
			}, &c.op)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := op.Do(ctx, 21); done <- err }()
			<-inside
			time.Sleep(3 * time.Second)
			other, _ := idem.NewOp(en.rtr, "charge", func(context.Context, int) (int, error) {
				t.Errorf("%s: the operation ran again", c.name)
				return 0, nil
			}, nil)
			if _, err := other.Do(ctx, 21); !errors.Is(err, idem.ErrHeld) {
				t.Fatalf("%s: past the lease: %v; want ErrHeld", c.name, err)
			}
			close(finish)
			if err := <-done; err != nil {
				t.Fatalf("%s: the late holder: %v", c.name, err)
			}
			if res, err := other.Do(ctx, 21); err != nil || !res.Replayed || res.Value != 42 {
				t.Fatalf("%s: after the late holder's outcome: %+v %v; want its replay", c.name, res, err)
			}
		}

		// At its expiry a held key is absent, and runs again.
		en := newHoldEnv(t, idem.Config{Lease: 2 * time.Second, Expiry: time.Minute})
		ctx := context.Background()
		r := req("expiring")
		r.HoldCrashed = true
		if b, err := en.first.Begin(ctx, r, &idem.BeginOptions{ExpectedCompletion: 2 * time.Second}); err != nil || !b.Acquired {
			t.Fatalf("Begin: %+v %v", b, err)
		}
		time.Sleep(time.Minute)
		res, err := idem.Do(ctx, en.rtr, req("expiring"), func(context.Context) (int, error) { return 1, nil })
		if err != nil || res.Fence != 2 {
			t.Fatalf("at the expiry of a held key: %+v %v; want a fresh claim (fence 2) that runs", res, err)
		}
	})
}

// A Begin meeting a held key answers its State (Hold set, not acquired)
// and counts it as held.
func TestBeginMeetsAHeldKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := newHoldEnv(t, idem.Config{Lease: 2 * time.Second, HoldCrashed: true})
		ctx := context.Background()
		if _, err := en.first.Begin(ctx, req("b"), &idem.BeginOptions{ExpectedCompletion: time.Second}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		b, err := en.rtr.Begin(ctx, req("b"), nil)
		if err != nil || b.Acquired || !b.State.Hold || b.State.Status != idem.StatusInProgress || en.obs.Count(observe.OutcomeHeld) != 1 {
			t.Fatalf("Begin on a held key: %+v %v, observer %v", b, err, en.obs.Snapshot())
		}
	})
}
