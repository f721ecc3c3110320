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
	// Deleted underneath: a fail is refused; a release finds nothing to
	// release, which is what it was asked for.
	if err := f.op.Apply(ctx, f.read(tok.Key), ops.Write{Action: ops.Delete}); err != nil {
		t.Fatal(err)
	}
	if err := f.op.Apply(ctx, st, ops.Write{Action: ops.Fail, Error: &idem.TerminalError{Code: "c", Message: "m"}}); !errors.As(err, &changed) || changed.Now != nil {
		t.Fatalf("fail of a deleted record: %v", err)
	}
	if err := f.op.Apply(ctx, st, ops.Write{Action: ops.Release}); err != nil {
		t.Fatalf("release of a deleted record: %v", err)
	}
}
