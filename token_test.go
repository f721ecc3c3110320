// Tests of tokens: stale, bad, signed, lost replies, parsing.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

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
	if !errors.Is(err, idem.ErrInvalidToken) || !strings.Contains(err.Error(), `"charge", not "refund"`) {
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

// Another holder of the claim's token (a worker given it too early) that
// settles the key first is not taken for the engine's own lost reply: the
// engine's write counts as refused, and every later call replays what the
// store holds, from the cache too.
func TestAnotherTokenHoldersWriteIsNotTakenAsOwn(t *testing.T) {
	en := setup(t, idem.Config{CacheEntries: 10_000})
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
	en := setup(t, idem.Config{CacheEntries: 10_000})
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
