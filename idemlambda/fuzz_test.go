package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/memstore"
)

// FuzzWrapRaw sends arbitrary events through a wrapped handler keyed by
// a JMESPath expression that parses a JSON body, twice: the handler runs at
// most once per event, a second call returns the same bytes, and a bad
// event is an error, never a panic. A JSON event fails only for want of a
// key, on the expression, or when the selected key has no canonical form
// (idem.ErrInvalidPayload: an exponent of a billion, nesting deeper than
// idem.MaxJSONDepth) — never on a number beyond float64's range
// (testdata/fuzz/FuzzWrapRaw).
func FuzzWrapRaw(f *testing.F) {
	for _, s := range []string{`{"body":"{\"id\":1}"}`, `{"body":"not json"}`, `{"body":null}`, `[]`, `"x"`, `{"body":"{\"id\":[null]}"}`,
		`{"body":"{\"id\":9007199254740993}"}`, `{"body":"{\"id\":1e1000000000}"}`} {
		f.Add([]byte(s))
	}
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	runs := 0
	h, err := idemlambda.WrapRaw(eng, "fuzz", func(ctx context.Context, p []byte) ([]byte, error) {
		runs++
		return json.Marshal(runs)
	}, &idemlambda.Config{KeyJMESPath: "powertools_json(body).id", RaiseOnMissingKey: true, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, event []byte) {
		before := runs
		a, err := h.Invoke(context.Background(), event)
		if err != nil {
			if runs != before {
				t.Fatalf("handler ran and the call failed: %v", err)
			}
			var ee *idemlambda.ExprError
			if !errors.Is(err, idemlambda.ErrMissingKey) && !errors.As(err, &ee) && !errors.Is(err, idem.ErrInvalidPayload) && json.Valid(event) {
				t.Fatalf("unexpected error for a JSON event: %v", err)
			}
			return
		}
		b, err := h.Invoke(context.Background(), event)
		if err != nil || string(a) != string(b) || runs > before+1 {
			t.Fatalf("second call: %s %v (first %s), runs %d→%d", b, err, a, before, runs)
		}
	})
}
