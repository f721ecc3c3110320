package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// engine returns an engine over a fresh memstore; the clock is the system
// clock, which is fake inside a synctest bubble.
func engine(t *testing.T, cfg idem.Config) *idem.Engine {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.New(mem, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func load(t *testing.T, name string, v any) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

type order struct {
	Body string `json:"body"`
}

type receipt struct {
	Charge string `json:"charge"`
	Run    int64  `json:"run"`
}

func TestWrapKeysByJMESPathOverTheRawEvent(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", func(ctx context.Context, o order) (receipt, error) {
		return receipt{Charge: "ch_1", Run: runs.Add(1)}, nil
	}, &idemlambda.FuncConfig[order, receipt]{Config: idemlambda.Config{
		KeyJMESPath:        `powertools_json(body).order_id`,
		ValidationJMESPath: `powertools_json(body).amount`,
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ev := func(orderID string, amount int, requestID string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{
			"body":           `{"order_id":"` + orderID + `","amount":` + strings.Repeat("9", amount) + `}`,
			"requestContext": map[string]string{"requestId": requestID}, // differs on every retry
		})
		return b
	}
	r1, err := h(ctx, ev("o-1", 2, "req-1"))
	r2, err2 := h(ctx, ev("o-1", 2, "req-2"))
	if err != nil || err2 != nil || r1 != r2 || runs.Load() != 1 {
		t.Fatalf("retry: %+v %v / %+v %v, runs %d", r1, err, r2, err2, runs.Load())
	}
	if _, err := h(ctx, ev("o-1", 3, "req-3")); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("same order, other amount: %v", err)
	}
	if r, err := h(ctx, ev("o-2", 2, "req-4")); err != nil || r.Run != 2 {
		t.Fatalf("another order: %+v %v", r, err)
	}
}

func TestMissingKeyRunsUnprotectedOrRaises(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	fn := func(ctx context.Context, o order) (receipt, error) { return receipt{Run: runs.Add(1)}, nil }
	ev := json.RawMessage(`{"body":"{\"amount\":5}"}`)
	warn := &strings.Builder{}
	lenient, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", fn, &idemlambda.FuncConfig[order, receipt]{Config: idemlambda.Config{
		KeyJMESPath: `powertools_json(body).order_id`, Logger: slog.New(slog.NewTextHandler(warn, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	lenient(context.Background(), ev)
	lenient(context.Background(), ev)
	if runs.Load() != 2 || !strings.Contains(warn.String(), "running unprotected") {
		t.Fatalf("runs %d, log %q", runs.Load(), warn)
	}
	strict, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", fn, &idemlambda.FuncConfig[order, receipt]{Config: idemlambda.Config{
		KeyJMESPath: `powertools_json(body).order_id`, RaiseOnMissingKey: true}})
	if err != nil {
		t.Fatal(err)
	}
	var mk *idemlambda.MissingKeyError
	if _, err := strict(context.Background(), ev); !errors.As(err, &mk) || !errors.Is(err, idemlambda.ErrMissingKey) || runs.Load() != 2 {
		t.Fatalf("raise on missing key: %v, runs %d", err, runs.Load())
	}
	if _, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", fn, &idemlambda.FuncConfig[order, receipt]{Config: idemlambda.Config{KeyJMESPath: `body[`}}); err == nil {
		t.Fatal("a broken expression was accepted")
	}
}

func TestLeaseIsTheInvocationDeadline(t *testing.T) {
	t.Parallel()
	eng := engine(t, idem.Config{})
	inside, finish := make(chan struct{}), make(chan struct{})
	h, err := idemlambda.Wrap(eng, "slow", func(ctx context.Context, in map[string]any) (string, error) {
		close(inside)
		<-finish
		return "done", nil
	}, &idemlambda.FuncConfig[map[string]any, string]{Key: func(ctx context.Context, in map[string]any) (string, error) {
		return in["id"].(string), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	done := make(chan error)
	go func() { _, err := h(ctx, json.RawMessage(`{"id":"x"}`)); done <- err }()
	<-inside
	_, err = h(context.Background(), json.RawMessage(`{"id":"x"}`))
	var ipe *idem.InProgressError
	// Leases are kept in whole milliseconds.
	if !errors.As(err, &ipe) || ipe.LeaseUntil.After(deadline) || ipe.LeaseUntil.Before(deadline.Add(-time.Millisecond)) {
		t.Fatalf("duplicate: %v; want the lease to end at the first invocation's deadline %v", err, deadline)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWrapRawReplaysBytes(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h, err := idemlambda.WrapRaw(engine(t, idem.Config{}), "raw", func(ctx context.Context, p []byte) ([]byte, error) {
		runs.Add(1)
		return append([]byte(`{"echo":`), append(p, '}')...), nil
	}, &idemlambda.Config{KeyJMESPath: "id"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := h.Invoke(context.Background(), []byte(`{"id":1,"x":2}`))
	b, err2 := h.Invoke(context.Background(), []byte(`{"x":2, "id":1}`))
	if err != nil || err2 != nil || string(a) != `{"echo":{"id":1,"x":2}}` || string(b) != string(a) || runs.Load() != 1 {
		t.Fatalf("%s %v / %s %v, runs %d", a, err, b, err2, runs.Load())
	}
	if _, err := h.Invoke(context.Background(), []byte(`not json`)); err == nil {
		t.Fatal("a non-JSON event was accepted")
	}
}

func TestTerminalErrorsAreReplayed(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", func(ctx context.Context, in map[string]any) (string, error) {
		runs.Add(1)
		return "", idem.Terminal(errors.New("card declined"), "card_declined")
	}, &idemlambda.FuncConfig[map[string]any, string]{Config: idemlambda.Config{KeyJMESPath: "id"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var te *idem.TerminalError
		if _, err := h(context.Background(), json.RawMessage(`{"id":"c1"}`)); !errors.As(err, &te) || te.Code != "card_declined" {
			t.Fatalf("%v", err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestOnReplaySeesReplayedResults(t *testing.T) {
	t.Parallel()
	h, err := idemlambda.Wrap(engine(t, idem.Config{}), "charge", func(ctx context.Context, in map[string]any) (receipt, error) {
		return receipt{Charge: "ch_1"}, nil
	}, &idemlambda.FuncConfig[map[string]any, receipt]{
		Config:   idemlambda.Config{KeyJMESPath: "id"},
		OnReplay: func(ctx context.Context, r receipt) receipt { r.Charge += " (replayed)"; return r },
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := h(context.Background(), json.RawMessage(`{"id":7}`))
	b, _ := h(context.Background(), json.RawMessage(`{"id":7}`))
	if a.Charge != "ch_1" || b.Charge != "ch_1 (replayed)" {
		t.Fatalf("first %+v, replay %+v", a, b)
	}
}
