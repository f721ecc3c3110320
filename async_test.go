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

func mustKey(t *testing.T, op, key string) idem.StoreKey {
	t.Helper()
	r := idem.Request{Operation: op, Key: key}
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// Work that outlives its expected completion without heartbeats loses the
// key to a retry; every write through its token is then refused with a
// typed error naming the current claim, and changes nothing. A heartbeat
// (Extend) keeps the key.
func TestStaleTokenIsRefused(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	slow := mustBegin(t, en.eng, ctx, req("s"), &idem.BeginOptions{ExpectedCompletion: time.Minute})
	en.clock.Advance(50 * time.Second)
	if err := en.eng.Extend(ctx, slow.Token, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	en.clock.Advance(50 * time.Second) // past the first expected completion, within the extended one
	if b := mustBegin(t, en.eng, ctx, req("s"), nil); b.Acquired {
		t.Fatal("a retry took over work that heartbeat")
	}
	en.clock.Advance(11 * time.Second)
	retry := mustBegin(t, en.eng, ctx, req("s"), nil)
	if !retry.Acquired || !retry.Takeover || retry.Token.Fence != slow.Token.Fence+1 {
		t.Fatalf("retry after the expected completion: %+v", retry)
	}
	before, _ := en.eng.Status(ctx, retry.Token.Key)
	writes := map[string]error{
		"Complete": en.eng.Complete(ctx, slow.Token, "late"),
		"Fail":     en.eng.Fail(ctx, slow.Token, errors.New("late")),
		"Release":  en.eng.Release(ctx, slow.Token),
		"Extend":   en.eng.Extend(ctx, slow.Token, time.Hour),
		"Attach":   en.eng.Attach(ctx, slow.Token, "late-exec"),
	}
	for name, err := range writes {
		var ste *idem.StaleTokenError
		if !errors.As(err, &ste) || !errors.Is(err, idem.ErrStaleToken) || !errors.Is(err, store.ErrFenced) {
			t.Errorf("%s through a stale token: %v, want a *StaleTokenError", name, err)
			continue
		}
		if ste.Fence != retry.Token.Fence || ste.Owner != retry.Token.Owner || ste.Status != idem.StatusInProgress {
			t.Errorf("%s: error names claim %d (%s) %v, want the retry's %d (%s)", name, ste.Fence, ste.Owner, ste.Status, retry.Token.Fence, retry.Token.Owner)
		}
	}
	after, _ := en.eng.Status(ctx, retry.Token.Key)
	if fmt.Sprint(*after) != fmt.Sprint(*before) {
		t.Fatalf("stale writes changed the record:\n%+v\n%+v", before, after)
	}
	// Once the retry's claim is released and the record gone, the stale
	// token's writes say so.
	if err := en.eng.Release(ctx, retry.Token); err != nil {
		t.Fatal(err)
	}
	if err := en.eng.Complete(ctx, slow.Token, "late"); !errors.Is(err, idem.ErrStaleToken) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Complete through a token of a vanished record: %v", err)
	}
	if err := en.eng.Extend(ctx, retry.Token, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("Extend by 0: %v", err)
	}
}

// Malformed tokens and tokens of another operation are refused before any
// store call.
func TestBadTokensNeverWrite(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	b := mustBegin(t, en.eng, ctx, req("b"), nil)
	good := b.Token.String()
	calls := en.store.Total()
	cases := map[string]string{
		"empty":           "",
		"not base64":      "!!!",
		"padded":          good + "==",
		"truncated":       good[:len(good)/2],
		"too long":        strings.Repeat("A", idem.MaxTokenLen+1),
		"another version": "AgE",
		"no owner":        idem.Token{Key: b.Token.Key, Fence: 1, Status: idem.StatusInProgress}.String(),
		"no fence":        idem.Token{Key: b.Token.Key, Owner: "o", Status: idem.StatusInProgress}.String(),
	}
	for name, s := range cases {
		if _, err := idem.ParseToken(s, ""); !errors.Is(err, idem.ErrInvalidToken) {
			t.Errorf("%s: ParseToken = %v, want ErrInvalidToken", name, err)
		}
	}
	_, err := idem.ParseToken(good, "refund")
	var te *idem.TokenError
	if !errors.As(err, &te) || !strings.Contains(te.Reason, `"charge", not "refund"`) {
		t.Fatalf("token of another operation: %v", err)
	}
	if en.store.Total() != calls {
		t.Fatal("refusing tokens made store calls")
	}
	if err := en.eng.Attach(ctx, b.Token, ""); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("empty reference: %v", err)
	}
	if err := en.eng.Attach(ctx, b.Token, "a\nb"); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("reference with a newline: %v", err)
	}
	if _, err := en.eng.Begin(ctx, req("b2"), &idem.BeginOptions{ExpectedCompletion: 2 * time.Hour}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("expected completion past the expiry: %v", err)
	}
}

// A FAILED record's token (read from its state) completes it, as a
// workflow redriven to success does; the same token is refused once the
// record changed.
func TestSettledRecordIsCorrectedThroughItsStateToken(t *testing.T) {
	en := setup(t, idem.Config{})
	ctx := context.Background()
	b := mustBegin(t, en.eng, ctx, req("r"), nil)
	if err := en.eng.Fail(ctx, b.Token, idem.Terminal(errors.New("timed out"), "States.Timeout")); err != nil {
		t.Fatal(err)
	}
	st, err := en.eng.Status(ctx, b.Token.Key)
	if err != nil {
		t.Fatal(err)
	}
	fix := st.Token()
	if fix.Status != idem.StatusFailed || fix.Fence != b.Token.Fence {
		t.Fatalf("state token %+v", fix)
	}
	if err := en.eng.Complete(ctx, b.Token, "x"); !errors.Is(err, idem.ErrStaleToken) {
		t.Fatalf("IN_PROGRESS token of a FAILED record: %v, want ErrStaleToken", err)
	}
	en.clock.Advance(time.Second)
	if err := en.eng.Complete(ctx, fix, "redriven"); err != nil {
		t.Fatalf("Complete through the FAILED record's token: %v", err)
	}
	res, err := idem.Do(ctx, en.eng, req("r"), func(context.Context) (string, error) { return "ran", nil })
	if err != nil || res.Value != "redriven" || !res.Replayed {
		t.Fatalf("Do after the correction: %+v, %v", res, err)
	}
	if err := en.eng.Release(ctx, fix); !errors.Is(err, idem.ErrStaleToken) {
		t.Fatalf("Release through the FAILED token of a now COMPLETED record: %v", err)
	}
}

// Writes through a token are retried through transient faults, and a
// retry that finds its own write landed (the reply was lost) succeeds.
func TestTokenWritesSurviveLostReplies(t *testing.T) {
	for _, method := range []string{"complete", "fail", "release", "extend"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				en := setup(t, idem.Config{Clock: store.SystemClock{}})
				ctx := context.Background()
				b := mustBegin(t, en.eng, ctx, req("l"), nil)
				en.store.LoseReplies(method, func(n int64) error {
					if n == 1 {
						return fmt.Errorf("connection reset: %w", store.ErrUnavailable)
					}
					return nil
				})
				var err error
				switch method {
				case "complete":
					err = en.eng.Complete(ctx, b.Token, "ok")
				case "fail":
					err = en.eng.Fail(ctx, b.Token, errors.New("no"))
				case "release":
					err = en.eng.Release(ctx, b.Token)
				case "extend":
					err = en.eng.Attach(ctx, b.Token, "exec")
				}
				if err != nil {
					t.Fatalf("%s with its first reply lost: %v", method, err)
				}
				if n := en.store.Calls(method); n != 2 {
					t.Fatalf("%d %s calls, want the lost one and one retry", n, method)
				}
			})
		})
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

func FuzzParseToken(f *testing.F) {
	k, _ := idem.ParseStoreKey("charge/t-1#" + strings.Repeat("ab", 32))
	f.Add(idem.Token{Key: k, Fence: 7, Owner: "host/1/abc/3", Status: idem.StatusInProgress}.String())
	f.Add(idem.Token{Key: k, Fence: 1 << 60, Owner: "ü", Status: idem.StatusFailed}.String())
	f.Add("AQE")
	f.Add("")
	signer, err := idem.New(memstore.New(&memstore.Config{SweepInterval: -1}), &idem.Config{TokenKey: []byte("fuzz-token-key-0123456789")})
	if err != nil {
		f.Fatal(err)
	}
	b, err := signer.Begin(context.Background(), idem.Request{Operation: "charge", Key: "k"}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b.Token.String())
	// Tokens with a trace context (version 3, 4 signed).
	for _, key := range [][]byte{nil, []byte("fuzz-token-key-0123456789")} {
		tracer, err := idem.New(memstore.New(&memstore.Config{SweepInterval: -1}), &idem.Config{Observer: &fakeTracer{}, TokenKey: key})
		if err != nil {
			f.Fatal(err)
		}
		b, err := tracer.Begin(context.Background(), idem.Request{Operation: "charge", Key: "k"}, nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b.Token.String())
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := idem.ParseToken(s, "")
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidToken) {
				t.Fatalf("error %v is not ErrInvalidToken", err)
			}
			return
		}
		again, err := idem.ParseToken(tok.String(), tok.Key.Operation)
		if err != nil || again != tok {
			t.Fatalf("round trip of %+v: %+v, %v", tok, again, err)
		}
		// A signing engine takes it only if it is the token it signed; it
		// never panics, and refuses before any store call.
		if err := signer.Release(context.Background(), tok); err != nil && !errors.Is(err, idem.ErrInvalidToken) && !errors.Is(err, idem.ErrStaleToken) {
			t.Fatalf("release through a parsed token: %v", err)
		}
	})
}

// An operation run by Do hands its claim off with Detach: the engine
// records nothing when it returns (not even its error), duplicates see the
// reference, and the token completes the key from another process. A
// deadline on the call's context (a Lambda invocation's) does not bound
// the handed-off claim.
func TestDetachHandsTheRunningClaimOff(t *testing.T) {
	en := setup(t, idem.Config{})
	worker := en.another(t, idem.Config{})
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(3*time.Second))
	defer cancel()
	var tok idem.Token
	for _, opErr := range []error{nil, errors.New("handler failed after handing off")} {
		tok = idem.Token{}
		key := fmt.Sprintf("detach-%v", opErr != nil)
		res, err := idem.Do(ctx, en.eng, req(key), func(ctx context.Context) (string, error) {
			var err error
			if tok, err = idem.Detach(ctx, 15*time.Minute, "job-42"); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			return "accepted", opErr
		})
		if res.Value != "accepted" || !errors.Is(err, opErr) {
			t.Fatalf("Do that detached: %+v, %v", res, err)
		}
		st, err := en.eng.Status(context.Background(), tok.Key)
		if err != nil || st.Status != idem.StatusInProgress || st.Ref != "job-42" || !st.LeaseUntil.Equal(t0.Add(15*time.Minute)) {
			t.Fatalf("record after Detach: %+v, %v", st, err)
		}
	}
	if en.store.Calls("complete")+en.store.Calls("release")+en.store.Calls("fail") != 0 {
		t.Fatal("the engine wrote an outcome for a handed-off claim")
	}
	if n := en.obs.Count(observe.OutcomeHandedOff); n != 2 {
		t.Fatalf("handed_off counted %d times, want 2", n)
	}
	en.clock.Advance(10 * time.Minute) // past the invocation's deadline and the engine's lease
	_, err := idem.Do(context.Background(), worker, req("detach-false"), func(context.Context) (string, error) {
		t.Fatal("a duplicate ran a handed-off key")
		return "", nil
	})
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ipe.Ref != "job-42" {
		t.Fatalf("duplicate of a handed-off key: %v, want an InProgressError with the reference", err)
	}
	b, _ := en.eng.Status(context.Background(), mustKeyOf(t, req("detach-false")))
	if err := worker.Complete(context.Background(), b.Token(), "done later"); err != nil {
		t.Fatalf("Complete through the handed-off token: %v", err)
	}
	res, err := idem.Do(context.Background(), en.eng, req("detach-false"), func(context.Context) (string, error) { return "again", nil })
	if err != nil || res.Value != "done later" || !res.Replayed {
		t.Fatalf("Do after the worker completed: %+v, %v", res, err)
	}
	if _, err := idem.Detach(context.Background(), time.Minute, ""); err == nil {
		t.Fatal("Detach outside an operation succeeded")
	}
}

// An in-process duplicate of a call that handed off learns the reference
// too, from the flight it joins.
func TestDetachReferenceReachesInProcessDuplicates(t *testing.T) {
	en := setup(t, idem.Config{})
	detached, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idem.Do(context.Background(), en.eng, req("f"), func(ctx context.Context) (string, error) {
			if _, err := idem.Detach(ctx, time.Minute, "queue/7"); err != nil {
				return "", err
			}
			close(detached)
			<-finish
			return "accepted", nil
		})
		done <- err
	}()
	<-detached
	_, err := idem.Do(context.Background(), en.eng, req("f"), func(context.Context) (string, error) { return "", nil })
	close(finish)
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ipe.Ref != "queue/7" || !ipe.LeaseUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("in-process duplicate: %v, want an InProgressError with the reference and the expected completion", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func mustKeyOf(t *testing.T, r idem.Request) idem.StoreKey {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// A caller configured to wait for a busy key does not wait for handed-off
// work: it runs for its expected completion, far past any wait.
func TestWaitDoesNotWaitForHandedOffWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		waiter := en.another(t, idem.Config{Wait: time.Minute})
		ctx := context.Background()
		if _, err := idem.Do(ctx, en.eng, req("w"), func(ctx context.Context) (string, error) {
			_, err := idem.Detach(ctx, time.Hour/2, "job-9")
			return "accepted", err
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := idem.Do(ctx, waiter, req("w"), func(context.Context) (string, error) { return "", nil })
		var ipe *idem.InProgressError
		if !errors.As(err, &ipe) || ipe.Ref != "job-9" {
			t.Fatalf("waiting duplicate of handed-off work: %v", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("the duplicate waited %v for handed-off work", waited)
		}
	})
}

// failingAttach refuses every Extend that attaches a reference: a hand-off
// whose write cannot land.
type failingAttach struct{ store.Store }

func (f failingAttach) Extend(ctx context.Context, p store.ExtendParams) error {
	if p.Ref != "" {
		return fmt.Errorf("connection reset: %w", store.ErrUnavailable)
	}
	return f.Store.Extend(ctx, p)
}

// A Detach whose write fails hands nothing off: the operation goes on in
// its caller and its lease is renewed again, so no one takes the key over
// while it runs.
func TestFailedDetachKeepsTheLeaseRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		cfg := idem.Config{Lease: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond, WriteTimeout: 60 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		holder, err := idem.New(failingAttach{mem}, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		other, _ := idem.New(mem, &cfg)
		var runs atomic.Int32
		done := make(chan error, 1)
		go func() {
			_, err := idem.Do(context.Background(), holder, req("d"), func(ctx context.Context) (int, error) {
				runs.Add(1)
				if _, err := idem.Detach(ctx, time.Minute, "job"); err == nil {
					return 0, errors.New("Detach succeeded through a store that refuses it")
				}
				time.Sleep(time.Second) // the work, done here after all
				return 1, ctx.Err()
			})
			done <- err
		}()
		time.Sleep(700 * time.Millisecond) // past the lease the failed Detach started from
		_, err = idem.Do(context.Background(), other, req("d"), func(context.Context) (int, error) { runs.Add(1); return 2, nil })
		if !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("a second caller during the work: %v, want ErrInProgress", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the operation ran %d times", n)
		}
	})
}

// Another holder of the claim's token (a worker given it too early) that
// settles the key first is not taken for the engine's own lost reply: the
// engine's write counts as refused, and every later call replays what the
// store holds, from the cache too.
func TestAnotherTokenHoldersWriteIsNotTakenAsOwn(t *testing.T) {
	en := setup(t, idem.Config{Cache: &idem.CacheConfig{}})
	ctx := context.Background()
	res, err := idem.Do(ctx, en.eng, req("o"), func(ctx context.Context) (int, error) {
		c, _ := idem.FromContext(ctx)
		k, _ := idem.ParseStoreKey(c.Key)
		if err := en.eng.Complete(ctx, idem.Token{Key: k, Fence: c.Fence, Owner: c.Owner, Status: idem.StatusInProgress}, 7); err != nil {
			t.Fatal(err)
		}
		return 8, nil
	})
	if err != nil || res.Value != 8 {
		t.Fatalf("Do: %+v, %v", res, err)
	}
	if en.obs.Count(observe.OutcomeFenced) != 1 {
		t.Fatalf("the engine's refused Complete was not counted as fenced: %v", en.obs.Snapshot())
	}
	again, err := idem.Do(ctx, en.eng, req("o"), func(context.Context) (int, error) { return 9, nil })
	if err != nil || again.Value != 7 || !again.Replayed {
		t.Fatalf("replay: %+v, %v; want the stored 7", again, err)
	}
	// The same for a second token write of another value.
	b := mustBegin(t, en.eng, ctx, req("o2"), nil)
	if err := en.eng.Complete(ctx, b.Token, 1); err != nil {
		t.Fatal(err)
	}
	if err := en.eng.Complete(ctx, b.Token, 2); !errors.Is(err, idem.ErrStaleToken) {
		t.Fatalf("a second Complete of another value through a settled token: %v, want ErrStaleToken", err)
	}
}

// Writes through a token change records this engine may have cached: it
// forgets them.
func TestTokenWritesForgetTheLocalCache(t *testing.T) {
	en := setup(t, idem.Config{Cache: &idem.CacheConfig{}})
	ctx := context.Background()
	do := func(key string, v int) idem.Result[int] {
		t.Helper()
		res, err := idem.Do(ctx, en.eng, req(key), func(context.Context) (int, error) { return v, nil })
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	do("c1", 1)
	st, _ := en.eng.Status(ctx, mustKeyOf(t, req("c1")))
	if err := en.eng.Complete(ctx, st.Token(), 5); err != nil {
		t.Fatal(err)
	}
	if r := do("c1", 2); r.Value != 5 {
		t.Fatalf("after a correction to 5 the engine replays %d", r.Value)
	}
	st, _ = en.eng.Status(ctx, mustKeyOf(t, req("c1")))
	if err := en.eng.Release(ctx, st.Token()); err != nil {
		t.Fatal(err)
	}
	if r := do("c1", 3); r.Replayed || r.Value != 3 {
		t.Fatalf("after a release the engine replays %+v instead of running", r)
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
