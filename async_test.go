// Tests of Begin and of work that outlives its call.

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
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

type transfer struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func mustBegin(t *testing.T, e *idem.Engine, ctx context.Context, r idem.Request, o *idem.BeginOptions) idem.Begun {
	t.Helper()
	b, err := e.Begin(ctx, r, o)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return b
}

// The whole life of work handed elsewhere: a starter begins, hands the
// token (as a string) to a worker in another process, which attaches its
// execution and completes; a duplicate during the work sees the holder and
// its execution, a duplicate after it gets the result, and a plain Do with
// the key replays it without running.
func TestBeginHandsTheClaimToAnotherProcess(t *testing.T) {
	en := setup(t, idem.Config{Lease: time.Minute})
	ctx := context.Background()
	starter := en.eng
	worker := en.another(t, idem.Config{})

	b := mustBegin(t, starter, idem.WithOwnerLabel(ctx, "req-7 from\tthe edge"), req("t-1"), &idem.BeginOptions{ExpectedCompletion: 10 * time.Minute})
	if !b.Acquired || b.Token.IsZero() || b.State.Status != idem.StatusInProgress {
		t.Fatalf("Begin of a new key: %+v", b)
	}
	if want := t0.Add(10 * time.Minute); !b.State.LeaseUntil.Equal(want) || !b.State.CreatedAt.Equal(t0) {
		t.Fatalf("expected completion %v, created %v; want %v, %v", b.State.LeaseUntil, b.State.CreatedAt, want, t0)
	}
	if !strings.HasSuffix(b.State.Owner, "/req-7_from_the_edge") {
		t.Fatalf("Owner %q does not end with the sanitised label", b.State.Owner)
	}
	wire := b.Token.String()
	if strings.ContainsAny(wire, "+/=") {
		t.Fatalf("token %q is not URL-safe", wire)
	}

	tok, err := idem.ParseToken(wire, "charge")
	if err != nil || tok != b.Token {
		t.Fatalf("ParseToken: %+v, %v; want %+v", tok, err, b.Token)
	}
	const arn = "arn:aws:states:us-east-1:123456789012:execution:transfers:charge-1"
	if err := worker.Attach(ctx, tok, arn); err != nil {
		t.Fatalf("Attach: %v", err)
	}

	en.clock.Advance(time.Minute) // the engine's own lease has passed; the expected completion has not
	dup := mustBegin(t, starter, ctx, req("t-1"), nil)
	if dup.Acquired || dup.State.Status != idem.StatusInProgress || dup.State.Ref != arn || dup.State.Owner != b.State.Owner {
		t.Fatalf("duplicate during the work: %+v (state %+v)", dup, dup.State)
	}
	if dup.State.Overdue(en.clock.Now()) {
		t.Fatal("work within its expected completion reported overdue")
	}

	if err := worker.Complete(ctx, tok, transfer{ID: "tr-1", Amount: 100}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	after := mustBegin(t, starter, ctx, req("t-1"), nil)
	var got transfer
	if after.Acquired || after.State.Status != idem.StatusCompleted || after.State.Decode(&got) != nil || got.ID != "tr-1" {
		t.Fatalf("duplicate after the work: %+v, decoded %+v", after.State, got)
	}
	if after.State.Ref != arn || !after.State.CompletedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("completed state keeps ref %q and completed at %v", after.State.Ref, after.State.CompletedAt)
	}
	res, err := idem.Do(ctx, starter, req("t-1"), func(context.Context) (transfer, error) {
		t.Fatal("Do ran the operation of a key completed through a token")
		return transfer{}, nil
	})
	if err != nil || !res.Replayed || res.Value.ID != "tr-1" {
		t.Fatalf("Do after Complete: %+v, %v", res, err)
	}
	st, err := worker.Status(ctx, tok.Key)
	if err != nil || st.Status != idem.StatusCompleted || st.Ref != arn {
		t.Fatalf("Status: %+v, %v", st, err)
	}
}

// Round trips per asynchronous call: a new call is two (claim, attach), a
// duplicate one (claim), a completion one.
func TestAsyncRoundTrips(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	b := mustBegin(t, en.eng, ctx, req("rt"), nil)
	if err := en.eng.Attach(ctx, b.Token, "exec-1"); err != nil {
		t.Fatal(err)
	}
	if n := en.store.Total(); n != 2 {
		t.Fatalf("a new async call made %d store calls, want 2 (claim, attach)", n)
	}
	mustBegin(t, en.eng, ctx, req("rt"), nil)
	if n := en.store.Total(); n != 3 {
		t.Fatalf("a duplicate made %d store calls, want 1", n-2)
	}
	if err := en.eng.Complete(ctx, b.Token, "ok"); err != nil {
		t.Fatal(err)
	}
	if n := en.store.Total(); n != 4 {
		t.Fatalf("a completion made %d store calls, want 1", n-3)
	}
}

func TestBeginAnswersExistingOutcomes(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	b := mustBegin(t, en.eng, ctx, req("f"), nil)
	if err := en.eng.Fail(ctx, b.Token, idem.Terminal(errors.New("insufficient funds"), "declined")); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	dup := mustBegin(t, en.eng, ctx, req("f"), nil)
	if dup.Acquired || dup.State.Status != idem.StatusFailed || dup.State.Err == nil || dup.State.Err.Code != "declined" || !dup.State.Err.Replayed {
		t.Fatalf("Begin of a FAILED key: %+v", dup.State)
	}
	if _, err := idem.Do(ctx, en.eng, req("f"), func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, idem.ErrTerminal) {
		t.Fatalf("Do of a key failed through a token: %v, want the stored terminal error", err)
	}
	// A plain error is stored with its message.
	b2 := mustBegin(t, en.eng, ctx, req("f2"), nil)
	if err := en.eng.Fail(ctx, b2.Token, errors.New("workflow aborted")); err != nil {
		t.Fatal(err)
	}
	if st, _ := en.eng.Status(ctx, b2.Token.Key); st.Err == nil || st.Err.Message != "workflow aborted" {
		t.Fatalf("stored plain error: %+v", st.Err)
	}
	// Another payload under the key is a mismatch, on Begin too.
	other := req("f")
	other.Payload = []byte(`{"amount":999}`)
	if _, err := en.eng.Begin(ctx, other, nil); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Begin with another payload: %v, want ErrMismatch", err)
	}
	if _, err := en.eng.Status(ctx, mustKey(t, "charge", "absent")); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Status of an absent key: %v, want ErrNotFound", err)
	}
}

// A store that cannot be reached fails Begin closed, with a StoreError.
func TestBeginFailsClosed(t *testing.T) {
	en := setup(t, idem.Config{FailOpen: true})
	en.store.FailAlways("claim", fmt.Errorf("refused: %w", store.ErrUnavailable))
	_, err := en.eng.Begin(context.Background(), req("d"), nil)
	var se *idem.StoreError
	if !errors.As(err, &se) || se.Op != observe.StoreClaim {
		t.Fatalf("Begin against a down store: %v, want a *StoreError of the claim", err)
	}
}

// A disabled engine claims nothing, but its tokens are well-formed and
// Detach answers, so asynchronous code runs unchanged in tests.
func TestDisabledEngineHandsOutTokens(t *testing.T) {
	en := setup(t, idem.Config{Disabled: true})
	ctx := context.Background()
	b := mustBegin(t, en.eng, ctx, req("x"), nil)
	tok, err := idem.ParseToken(b.Token.String(), "charge")
	if err != nil || !b.Acquired {
		t.Fatalf("disabled Begin: %+v; its token: %v", b, err)
	}
	if err := en.eng.Complete(ctx, tok, 1); err != nil {
		t.Fatal(err)
	}
	res, err := idem.Do(ctx, en.eng, req("x"), func(ctx context.Context) (string, error) {
		d, err := idem.Detach(ctx, time.Minute, "job")
		return d.String(), err
	})
	if err != nil || res.Value == "" {
		t.Fatalf("Detach under a disabled engine: %+v, %v", res, err)
	}
	if en.store.Total() != 0 {
		t.Fatalf("a disabled engine made %d store calls", en.store.Total())
	}
}

// hangingExtend never answers its first two Extends (requests or replies
// lost on the way): such a call returns only when its context ends.
type hangingExtend struct {
	store.Store
	calls atomic.Int32
}

func (h *hangingExtend) Extend(ctx context.Context, p store.ExtendParams) error {
	if h.calls.Add(1) <= 2 {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Store.Extend(ctx, p)
}

// A lease renewal that never gets an answer gives up after half a renewal
// interval and is tried again a quarter later, so a renewal succeeds before
// the lease ends and no one takes over work that is still running (a
// WriteTimeout longer than the lease must not let it lapse).
func TestUnansweredRenewalDoesNotLetTheLeaseLapse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		hs := &hangingExtend{Store: mem}
		holder, err := idem.New(hs, &idem.Config{Lease: 2 * time.Second, WriteTimeout: 10 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		other, _ := idem.New(mem, &idem.Config{Logger: quiet})
		var runs atomic.Int32
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(context.Background(), holder, req("h"), func(ctx context.Context) (int, error) {
				runs.Add(1)
				time.Sleep(5 * time.Second)
				return 1, ctx.Err()
			})
			done <- err
		}()
		for i := range 4 {
			time.Sleep(time.Second)
			if _, err := idem.Do(context.Background(), other, req("h"), func(context.Context) (int, error) { runs.Add(1); return 2, nil }); !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("%ds into the work: %v, want ErrInProgress", i+1, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("ran %d times", n)
		}
	})
}

// Result.Recorded says what this call's outcome write left in the store:
// COMPLETED, FAILED, or nothing when the write was refused; a replay
// recorded nothing.
func TestResultSaysWhatWasRecorded(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	ok, err := idem.Do(ctx, en.eng, req("r1"), func(context.Context) (int, error) { return 1, nil })
	if err != nil || ok.Recorded != idem.StatusCompleted {
		t.Fatalf("success: Recorded %v, %v", ok.Recorded, err)
	}
	failed, err := idem.Do(ctx, en.eng, req("r2"), func(context.Context) (int, error) {
		return 0, idem.Terminal(errors.New("declined"), "declined")
	})
	if !errors.Is(err, idem.ErrTerminal) || failed.Recorded != idem.StatusFailed {
		t.Fatalf("terminal error: Recorded %v, %v", failed.Recorded, err)
	}
	replay, _ := idem.Do(ctx, en.eng, req("r1"), func(context.Context) (int, error) { return 2, nil })
	if !replay.Replayed || replay.Recorded != 0 {
		t.Fatalf("replay: %+v", replay)
	}
	refused, err := idem.Do(ctx, en.eng, req("r3"), func(ctx context.Context) (int, error) {
		c, _ := idem.FromContext(ctx)
		k, _ := idem.ParseStoreKey(c.Key)
		if err := en.eng.Complete(ctx, idem.Token{Key: k, Fence: c.Fence, Owner: c.Owner, Status: idem.StatusInProgress}, 7); err != nil {
			t.Fatal(err)
		}
		return 8, nil
	})
	if err != nil || refused.Recorded != 0 {
		t.Fatalf("a refused Complete: Recorded %v, %v", refused.Recorded, err)
	}
}
