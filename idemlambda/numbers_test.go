package idemlambda_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/canonical"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store"
)

// TestNumbersAreReadExactly: numbers in the event are decoded exactly, so a
// key selected from one is what canonical.JSON makes of the number as
// sent — a number beyond float64's range is a key, not a failed
// invocation, and two integers float64 cannot tell apart are two keys —
// while JMESPath comparisons and functions still work on ordinary numbers.
func TestNumbersAreReadExactly(t *testing.T) {
	t.Parallel()
	const scope = "numbers"
	// setup wraps a handler that counts its runs, keyed by expr.
	setup := func(t *testing.T, expr string) (invoke func(event string) error, runs *int, storedUnder func(material string) bool) {
		eng := engine(t, idem.Config{})
		runs = new(int)
		h, err := idemlambda.WrapRaw(eng, "h", func(ctx context.Context, p []byte) ([]byte, error) {
			*runs++
			return []byte(strconv.Itoa(*runs)), nil
		}, &idemlambda.Config{Operation: scope, KeyJMESPath: expr, RaiseOnMissingKey: true, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		invoke = func(event string) error {
			_, err := h.Invoke(context.Background(), []byte(event))
			return err
		}
		// storedUnder reports whether a record is stored under the key
		// whose material is the canonical form of the JSON material.
		storedUnder = func(material string) bool {
			t.Helper()
			c, err := canonical.JSON([]byte(material))
			if err != nil {
				t.Fatal(err)
			}
			k, err := idem.NewStoreKey(scope, "", c)
			if err != nil {
				t.Fatal(err)
			}
			_, err = eng.Store().Get(context.Background(), k.String())
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatal(err)
			}
			return err == nil
		}
		return invoke, runs, storedUnder
	}

	t.Run("beyond float64's range", func(t *testing.T) {
		t.Parallel()
		invoke, runs, storedUnder := setup(t, "id")
		for _, ev := range []string{`{"id":1E700}`, `{"id": 1e+700, "other": 2}`, `{"id":10E699}`} {
			if err := invoke(ev); err != nil {
				t.Fatalf("%s: %v", ev, err)
			}
		}
		if *runs != 1 || !storedUnder(`1E700`) {
			t.Fatalf("ran %d times; stored under Canonicalize(1E700): %v", *runs, storedUnder(`1E700`))
		}
		// Elsewhere in the event, such a number is no obstacle either.
		if err := invoke(`{"id":7,"amount":-1E700}`); err != nil || *runs != 2 || !storedUnder(`7`) {
			t.Fatalf("%v, ran %d times", err, *runs)
		}
	})
	t.Run("integers float64 cannot tell apart", func(t *testing.T) {
		t.Parallel()
		invoke, runs, storedUnder := setup(t, "id")
		for _, ev := range []string{`{"id":9007199254740993}`, `{"id":9007199254740992}`, `{"id":0.1}`, `{"id":0.10000000000000001}`} {
			if err := invoke(ev); err != nil {
				t.Fatalf("%s: %v", ev, err)
			}
		}
		if *runs != 4 || !storedUnder(`9007199254740993`) || !storedUnder(`0.10000000000000001`) {
			t.Fatalf("ran %d times, want 4 different keys", *runs)
		}
		// Numerically equal spellings are one key, as in Canonicalize.
		for _, ev := range []string{`{"id":1}`, `{"id":1.0}`, `{"id":10e-1}`} {
			if err := invoke(ev); err != nil {
				t.Fatalf("%s: %v", ev, err)
			}
		}
		if *runs != 5 || !storedUnder(`1`) {
			t.Fatalf("ran %d times, want 5", *runs)
		}
	})
	t.Run("powertools_json", func(t *testing.T) {
		t.Parallel()
		invoke, runs, storedUnder := setup(t, "powertools_json(body).[id, n]")
		if err := invoke(`{"body":"{\"id\":1E700,\"n\":9007199254740993}"}`); err != nil {
			t.Fatal(err)
		}
		if *runs != 1 || !storedUnder(`[1E700,9007199254740993]`) {
			t.Fatalf("ran %d times; not stored under the exact key", *runs)
		}
	})
	t.Run("comparisons and functions on ordinary numbers", func(t *testing.T) {
		t.Parallel()
		invoke, runs, storedUnder := setup(t, "[items[?qty > `1`].sku, sum(items[?qty < `100`].qty), length(items)]")
		// 1E700 is not a number to JMESPath: neither > 1 nor < 100.
		ev := `{"items":[{"sku":"a","qty":2},{"sku":"b","qty":1},{"sku":"c","qty":0.5},{"sku":"d","qty":1E700}]}`
		if err := invoke(ev); err != nil {
			t.Fatal(err)
		}
		if *runs != 1 || !storedUnder(`[["a"],3.5,4]`) {
			t.Fatalf("ran %d times; not stored under the expected selection", *runs)
		}
	})
	t.Run("numbers Canonicalize refuses", func(t *testing.T) {
		t.Parallel()
		invoke, runs, _ := setup(t, "id")
		if err := invoke(`{"id":1e1000000000}`); !errors.Is(err, idem.ErrInvalidPayload) || *runs != 0 {
			t.Fatalf("%v, ran %d times", err, *runs)
		}
		if err := invoke(`{"id":1,"x":1e1000000000}`); err != nil || *runs != 1 {
			t.Fatalf("not selected: %v, ran %d times", err, *runs)
		}
	})
	t.Run("not JSON", func(t *testing.T) {
		t.Parallel()
		invoke, runs, _ := setup(t, "id")
		for _, ev := range []string{`{"id":1} x`, `{"id":1} {"id":2}`, `{"id":01}`, `{"id":1`} {
			if err := invoke(ev); err == nil || !strings.Contains(err.Error(), "not JSON") {
				t.Errorf("%s: %v", ev, err)
			}
		}
		if *runs != 0 {
			t.Fatalf("ran %d times", *runs)
		}
	})
}
