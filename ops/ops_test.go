package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	t     *testing.T
	clock *clocktest.Clock
	app   *idem.Engine
	op    *ops.Operator
}

func setup(t *testing.T) *fixture {
	t.Helper()
	clock := clocktest.New(time.Now().Truncate(time.Second))
	s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: clock})
	t.Cleanup(func() { s.Close() })
	app, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, clock: clock, app: app, op: &ops.Operator{Store: s, Clock: clock, Owner: "test"}}
}

// begin claims key for work expected to take d.
func (f *fixture) begin(key string, d time.Duration) idem.Token {
	f.t.Helper()
	b, err := f.app.Begin(context.Background(), idem.Request{Operation: "charge", Key: key}, &idem.BeginOptions{ExpectedCompletion: d})
	if err != nil || !b.Acquired {
		f.t.Fatalf("begin %s: %+v %v", key, b, err)
	}
	return b.Token
}

func (f *fixture) read(k idem.StoreKey) *idem.State {
	f.t.Helper()
	st, err := f.op.Read(context.Background(), k)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

func TestWriteValidate(t *testing.T) {
	t.Parallel()
	for name, w := range map[string]ops.Write{
		"unknown action":      {Action: "purge"},
		"complete, no result": {Action: ops.Complete},
		"fail, no error":      {Action: ops.Fail},
		"fail, no code":       {Action: ops.Fail, Error: &idem.TerminalError{Message: "m"}},
		"release with result": {Action: ops.Release, Result: []byte("1")},
		"negative expiry":     {Action: ops.Delete, Expiry: -time.Second},
		"complete with error": {Action: ops.Complete, Result: []byte("1"), Error: &idem.TerminalError{Code: "c", Message: "m"}},
	} {
		if err := w.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, w)
		}
	}
	if _, err := ops.ParseError("nocolon"); err == nil {
		t.Error("ParseError accepted a value without CODE:")
	}
}

// A fresh claim needs Force; a COMPLETED record is not released; a stuck
// one is resolved, and a retry replays the resolved result.
func TestApplyRules(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tok := f.begin("k1", time.Minute)
	st := f.read(tok.Key)
	w := ops.Write{Action: ops.Complete, Result: []byte(`{"ok":true}`)}
	var fresh *ops.FreshError
	if err := f.op.Apply(ctx, st, w); !errors.As(err, &fresh) {
		t.Fatalf("fresh claim: %v, want a FreshError", err)
	}
	f.clock.Advance(2 * time.Minute)
	if err := f.op.Apply(ctx, st, w); err != nil {
		t.Fatal(err)
	}
	done := f.read(tok.Key)
	if done.Status != idem.StatusCompleted || string(done.Result) != `{"ok":true}` {
		t.Fatalf("after resolve: %+v", done)
	}
	if err := f.op.Apply(ctx, done, ops.Write{Action: ops.Release}); !errors.Is(err, ops.ErrReleaseCompleted) {
		t.Fatalf("release of COMPLETED: %v", err)
	}
	if err := f.op.Apply(ctx, done, ops.Write{Action: ops.Delete}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.op.Read(ctx, tok.Key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	// Force settles a fresh claim.
	tok2 := f.begin("k2", time.Minute)
	if err := f.op.Apply(ctx, f.read(tok2.Key), ops.Write{Action: ops.Fail, Force: true, Error: &idem.TerminalError{Code: "c", Message: "m"}}); err != nil {
		t.Fatal(err)
	}
	if st := f.read(tok2.Key); st.Status != idem.StatusFailed || st.Err.Code != "c" {
		t.Fatalf("after forced fail: %+v", st)
	}
}

// A record that changed between the read and the write is not written.
func TestApplyRefusesARecordThatChanged(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tok := f.begin("k", time.Minute)
	f.clock.Advance(2 * time.Minute)
	st := f.read(tok.Key) // the operator reads it stuck…
	if err := f.app.Complete(ctx, tok, "by the holder"); err != nil {
		t.Fatal(err) // …and the holder completes it
	}
	var changed *ops.ChangedError
	err := f.op.Apply(ctx, st, ops.Write{Action: ops.Fail, Error: &idem.TerminalError{Code: "c", Message: "m"}})
	if !errors.As(err, &changed) || changed.Now == nil || changed.Now.Status != idem.StatusCompleted {
		t.Fatalf("write over a changed record: %v", err)
	}
	if got := f.read(tok.Key); got.Status != idem.StatusCompleted || string(got.Result) != `"by the holder"` {
		t.Fatalf("the holder's outcome was overwritten: %+v", got)
	}
	// Deleted underneath: a fail is refused, and so is a release: the
	// record it was to release is not the record there is (none).
	if err := f.op.Apply(ctx, f.read(tok.Key), ops.Write{Action: ops.Delete}); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Apply(ctx, st, ops.Write{Action: ops.Fail, Error: &idem.TerminalError{Code: "c", Message: "m"}}); !errors.As(err, &changed) || changed.Now != nil {
		t.Fatalf("fail of a deleted record: %v", err)
	}
	if err := f.op.Apply(ctx, st, ops.Write{Action: ops.Release}); !errors.As(err, &changed) || changed.Now != nil {
		t.Fatalf("release of a deleted record: %v", err)
	}
}

// Two operators read the same settled record and settle it at once, each
// through an Operator of its own (two idemctl runs, two console
// sessions): one write lands, the other is refused with a ChangedError
// and writes nothing, whichever action each takes. A FAILED record failed
// twice is written once.
func TestTwoOperatorsSettleOnce(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		failFirst bool
		a, b      ops.Write
	}{
		"complete a COMPLETED record twice": {a: complete(`"by A"`), b: complete(`"by B"`)},
		"complete it twice the same":        {a: complete(`"same"`), b: complete(`"same"`)},
		"fail a FAILED record twice":        {failFirst: true, a: fail("a", "by A"), b: fail("b", "by B")},
		"fail and complete a FAILED record": {failFirst: true, a: fail("a", "by A"), b: complete(`"by B"`)},
		"release a FAILED record twice":     {failFirst: true, a: ops.Write{Action: ops.Release}, b: ops.Write{Action: ops.Release}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			tok := f.begin("k", time.Minute)
			var err error
			if tc.failFirst {
				err = f.app.Fail(ctx, tok, &idem.TerminalError{Code: "declined", Message: "card declined"})
			} else {
				err = f.app.Complete(ctx, tok, "by the holder")
			}
			if err != nil {
				t.Fatal(err)
			}
			shown := f.read(tok.Key) // both operators' pages show this record
			b := &ops.Operator{Store: f.app.Store(), Clock: f.clock, Owner: "operator-b"}
			errs := make(chan error, 2)
			start := make(chan struct{})
			for _, apply := range []func() error{
				func() error { return f.op.Apply(ctx, shown, tc.a) },
				func() error { return b.Apply(ctx, shown, tc.b) },
			} {
				go func() {
					<-start
					errs <- apply()
				}()
			}
			close(start)
			var done, refused int
			for range 2 {
				var changed *ops.ChangedError
				switch err := <-errs; {
				case err == nil:
					done++
				case errors.As(err, &changed):
					refused++
				default:
					t.Fatal(err)
				}
			}
			if done != 1 || refused != 1 {
				t.Fatalf("%d writes landed and %d were refused; want one of each", done, refused)
			}
		})
	}
}

// A settlement made after the page was shown refuses a second one, even
// when claim and status stay the same: the guard covers the result, the
// error and the expiry.
func TestGuardCoversWhatWasShown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tok := f.begin("k", time.Minute)
	if err := f.app.Fail(ctx, tok, &idem.TerminalError{Code: "declined", Message: "card declined"}); err != nil {
		t.Fatal(err)
	}
	shown := f.read(tok.Key)
	f.clock.Advance(time.Second)
	if err := f.op.Apply(ctx, shown, fail("declined", "card declined")); err != nil {
		t.Fatal(err) // the same error again: only the settling time changes
	}
	var changed *ops.ChangedError
	if err := f.op.Apply(ctx, shown, fail("timeout", "by B")); !errors.As(err, &changed) || changed.Now.Status != idem.StatusFailed {
		t.Fatalf("second fail of what was shown: %v", err)
	}
	if st := f.read(tok.Key); st.Err.Code != "declined" {
		t.Fatalf("the second fail was written: %+v", st.Err)
	}
	again := f.read(tok.Key)
	if ops.Guard(again) == ops.Guard(shown) {
		t.Fatal("a rewrite of the same error left the guard as it was")
	}
	if err := f.op.Apply(ctx, again, ops.Write{Action: ops.Fail, Expiry: time.Hour, Error: &idem.TerminalError{Code: "declined", Message: "card declined"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Apply(ctx, again, ops.Write{Action: ops.Release}); !errors.As(err, &changed) {
		t.Fatalf("release after the expiry changed: %v", err)
	}
}

// A step the holder records after the page was shown (its claim, status
// and times unchanged) refuses the write: the guard covers the steps.
func TestGuardCoversTheSteps(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tok := f.begin("k", time.Minute)
	f.clock.Advance(2 * time.Minute) // stuck
	held := f.read(tok.Key)
	step := func(i int, name string) {
		t.Helper()
		err := f.op.Store.(store.Stepper).RecordStep(ctx, store.StepParams{
			ClaimRef: store.ClaimRef{Key: tok.Key.String(), Fence: held.Fence, Owner: held.Owner, Now: store.Millis(f.clock.Now())},
			Index:    i, Step: store.Step{Name: name, Result: []byte(`"ok"`), At: store.Millis(f.clock.Now())},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	step(0, "charge")
	shown := f.read(tok.Key)
	if len(shown.Steps) != 1 || ops.Guard(shown) == ops.Guard(held) {
		t.Fatalf("a recorded step: steps %+v, guard unchanged %v", shown.Steps, ops.Guard(shown) == ops.Guard(held))
	}
	step(1, "email")
	var changed *ops.ChangedError
	if err := f.op.Apply(ctx, shown, ops.Write{Action: ops.Release}); !errors.As(err, &changed) {
		t.Fatalf("release after a step was recorded: %v, want a ChangedError", err)
	}
	if st := f.read(tok.Key); len(st.Steps) != 2 {
		t.Fatalf("the refused release changed the record: %+v", st)
	}
	if err := f.op.Apply(ctx, f.read(tok.Key), ops.Write{Action: ops.Release}); err != nil {
		t.Fatalf("release of the record as it is: %v", err)
	}
}

// Operator writes never pass through a disabled engine: with
// IDEM_DISABLED set, release, complete and fail change the record.
func TestOperatorWritesIgnoreIdemDisabled(t *testing.T) {
	t.Setenv("IDEM_DISABLED", "true")
	clock := clocktest.New(time.Now().Truncate(time.Second))
	s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: clock})
	defer s.Close()
	app, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7", Disabled: false})
	if err != nil {
		t.Fatal(err)
	}
	if !app.Config().Disabled {
		t.Fatal("IDEM_DISABLED did not disable the application's engine")
	}
	// The application's engine is disabled: claim the records straight
	// through the store.
	claim := func(key string) idem.StoreKey {
		k, err := idem.NewStoreKey("charge", "", []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		now := store.Millis(clock.Now())
		if _, err := s.Claim(context.Background(), store.ClaimParams{Key: k.String(), Owner: "worker-7/1", Now: now,
			LeaseUntil: now, ExpiresAt: now + time.Hour.Milliseconds()}); err != nil {
			t.Fatal(err)
		}
		return k
	}
	op := &ops.Operator{Store: s, Clock: clock}
	ctx := context.Background()
	read := func(k idem.StoreKey) *idem.State {
		st, err := op.Read(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	clock.Advance(time.Second)
	released, completed, failed := claim("r"), claim("c"), claim("f")
	if err := op.Apply(ctx, read(released), ops.Write{Action: ops.Release}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Read(ctx, released); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("released record: %v, want it gone", err)
	}
	if err := op.Apply(ctx, read(completed), complete(`"ok"`)); err != nil {
		t.Fatal(err)
	}
	if st := read(completed); st.Status != idem.StatusCompleted || string(st.Result) != `"ok"` {
		t.Fatalf("completed record: %+v", st)
	}
	if err := op.Apply(ctx, read(failed), fail("c", "m")); err != nil {
		t.Fatal(err)
	}
	if st := read(failed); st.Status != idem.StatusFailed || st.Err.Code != "c" {
		t.Fatalf("failed record: %+v", st)
	}
}

func complete(result string) ops.Write {
	return ops.Write{Action: ops.Complete, Result: []byte(result)}
}

func fail(code, msg string) ops.Write {
	return ops.Write{Action: ops.Fail, Error: &idem.TerminalError{Code: code, Message: msg}}
}
