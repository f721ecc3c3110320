// Tests of the typed calls: keys from inputs, stored values of the wrong
// type, operations that record their own success.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

type chargeIn struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
	Note    string `json:"note"`
}

func TestOpKeyFromInputComputedBeforeTheCall(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	runs := 0
	op, err := idem.NewOp(en.eng, "charge", func(ctx context.Context, in *chargeIn) (string, error) {
		runs++
		in.OrderID = "mutated" // must not change the recorded key
		return "ok-" + fmt.Sprint(in.Amount), nil
	}, &idem.OpConfig[*chargeIn, string]{
		Key: func(in *chargeIn) (string, error) { return in.OrderID, nil },
		Payload: func(in *chargeIn) ([]byte, error) {
			return fmt.Appendf(nil, `{"order":%q,"amount":%d}`, in.OrderID, in.Amount), nil
		},
		OnReplay: func(_ context.Context, s string) string { return s + " (replayed)" },
	})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 5, Note: "a"})
	if err != nil || r1.Value != "ok-5" {
		t.Fatal(r1, err)
	}
	// Note is outside the payload selection: same key, same fingerprint.
	r2, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 5, Note: "b"})
	if err != nil || r2.Value != "ok-5 (replayed)" || runs != 1 {
		t.Fatalf("replay: %+v %v runs=%d", r2, err, runs)
	}
	if _, err := op.Do(ctx, &chargeIn{OrderID: "o-1", Amount: 6}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("same key, other amount: %v", err)
	}
	if _, err := idem.NewOp[int, int](en.eng, "bad name!", func(context.Context, int) (int, error) { return 0, nil }, nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("bad op name: %v", err)
	}
	f := op.Func()
	if v, err := f(ctx, &chargeIn{OrderID: "o-1", Amount: 5}); err != nil || v != "ok-5 (replayed)" {
		t.Fatal(v, err)
	}
}

func TestOpWholePayloadKey(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	runs := 0
	op, err := idem.NewOp(en.eng, "notify", func(_ context.Context, in map[string]any) (int, error) { runs++; return len(in), nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []map[string]any{{"a": 1, "b": 2}, {"b": 2, "a": 1}} {
		if _, err := op.Do(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := op.Do(context.Background(), map[string]any{"a": 2}); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("ran %d times for 2 distinct payloads", runs)
	}
}

func TestStoredResultOfWrongTypeIsAnErrorNotGarbage(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	if _, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (string, error) { return "text", nil }); err != nil {
		t.Fatal(err)
	}
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("decoding a string result into int: %v, want ErrCorrupt", err)
	}
}

// An operation may complete its own record, in its own transaction
// (DoCompleting, as idempg.DoTx does): the engine encodes the value once,
// makes no Complete of its own, and replays the record.
func TestOperationCompletedItsOwnRecord(t *testing.T) {
	en := setup(t, idem.Config{RenewInterval: -1, CacheEntries: 10_000})
	ctx := context.Background()
	codec := &countingCodec{}
	en.eng = en.another(t, idem.Config{RenewInterval: -1, Codec: codec, Observer: en.obs})
	res, err := idem.DoCompleting(ctx, en.eng, req("self"), func(ctx context.Context, c *idem.Completion[string]) (string, error) {
		p, err := c.Params("v")
		if err != nil {
			return "", err
		}
		return "v", en.mem.Complete(ctx, p) // the operation's own transaction
	})
	if err != nil || res.Value != "v" {
		t.Fatalf("DoCompleting: %+v, %v", res, err)
	}
	if n := en.store.Calls("complete"); n != 0 {
		t.Fatalf("engine made %d Complete calls for a self-completed record, want 0", n)
	}
	if codec.marshals.Load() != 1 {
		t.Fatalf("value encoded %d times, want once", codec.marshals.Load())
	}
	if n := en.obs.Count(observe.OutcomeCompleteFailed) + en.obs.Count(observe.OutcomeFenced); n != 0 {
		t.Fatalf("self-completed record counted %d failed/fenced writes", n)
	}
	again, err := idem.Do(ctx, en.eng, req("self"), func(context.Context) (string, error) { return "second", nil })
	if err != nil || !again.Replayed || again.Value != "v" {
		t.Fatalf("replay: %+v, %v", again, err)
	}
}

// Completion.Params applies Config.MaxResultBytes, as Do's Complete does:
// the operation gets a CodeResultTooLarge terminal error to return instead
// of committing, the key is FAILED with it, and a retry replays it.
func TestOperationCompletingItsOwnRecordKeepsMaxResultBytes(t *testing.T) {
	en := setup(t, idem.Config{RenewInterval: -1, MaxResultBytes: 8})
	ctx := context.Background()
	runs := 0
	op := func(ctx context.Context, c *idem.Completion[string]) (string, error) {
		runs++
		p, err := c.Params("a value over eight bytes")
		if err != nil {
			return "", err // the operation's transaction rolls back
		}
		return "v", en.mem.Complete(ctx, p)
	}
	for i := range 2 {
		_, err := idem.DoCompleting(ctx, en.eng, req("large"), op)
		var te *idem.TerminalError
		if !errors.Is(err, idem.ErrResultTooLarge) || !errors.As(err, &te) || te.Code != idem.CodeResultTooLarge {
			t.Fatalf("call %d: %v, want ErrResultTooLarge", i, err)
		}
	}
	if runs != 1 || en.store.Calls("complete") != 0 {
		t.Fatalf("%d runs, %d Completes; want 1 run and none", runs, en.store.Calls("complete"))
	}
}

// A disabled engine runs the operation with Completion.Unprotected set, and
// Params refuses: there is no claim to complete.
func TestOperationCompletingItsOwnRecordUnprotected(t *testing.T) {
	en := setup(t, idem.Config{Disabled: true})
	res, err := idem.DoCompleting(context.Background(), en.eng, req("off"), func(ctx context.Context, c *idem.Completion[string]) (string, error) {
		if !c.Unprotected() {
			return "", errors.New("Unprotected is false on a disabled engine")
		}
		if _, err := c.Params("v"); !errors.Is(err, idem.ErrInvalidArgument) {
			return "", fmt.Errorf("Params without a claim: %v, want ErrInvalidArgument", err)
		}
		return "v", nil
	})
	if err != nil || res.Value != "v" {
		t.Fatalf("DoCompleting: %+v, %v", res, err)
	}
}

type countingCodec struct {
	idem.JSONCodec
	marshals atomic.Int32
}

func (c *countingCodec) Marshal(v any) ([]byte, error) {
	c.marshals.Add(1)
	return c.JSONCodec.Marshal(v)
}
