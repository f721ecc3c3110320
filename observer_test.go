package idem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

func TestStoreResultOf(t *testing.T) {
	t.Parallel()
	unavailable := fmt.Errorf("redisstore: claim k: %w: %w", store.ErrUnavailable, errors.New("dial tcp: connection refused"))
	for _, tc := range []struct {
		name string
		err  error
		want observe.StoreResult
	}{
		{"nil is ok", nil, observe.StoreOK},
		{"not found", fmt.Errorf("get: %w", store.ErrNotFound), observe.StoreNotFound},
		{"fenced error", &store.FencedError{Key: "k", Fence: 1, Current: 2}, observe.StoreFenced},
		{"too large error", &store.TooLargeError{Key: "k", Size: 2, Limit: 1}, observe.StoreTooLarge},
		{"corrupt error", &store.CorruptError{Key: "k", Reason: "crc"}, observe.StoreCorrupt},
		{"backend unreachable", unavailable, observe.StoreUnavailable},
		{"deadline, unwrapped", context.DeadlineExceeded, observe.StoreUnavailable},
		{"deadline, wrapped as unavailable", fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded), observe.StoreUnavailable},
		{"caller cancelled, wrapped as unavailable", fmt.Errorf("%w: %w", store.ErrUnavailable, context.Canceled), observe.StoreCanceled},
		{"throttled, wrapped as unavailable", fmt.Errorf("dynamostore: claim k: %w: %w", store.ErrThrottled, store.ErrUnavailable), observe.StoreThrottled},
		{"untranslated backend error", errors.New("ERR unknown command"), observe.StoreOtherError},
		{"as the engine wraps it", &idem.StoreError{Op: observe.StoreClaim, Key: "k", Err: unavailable}, observe.StoreUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := observe.StoreResultOf(tc.err); got != tc.want {
				t.Errorf("StoreResultOf(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// Exporters index by these lists: every value once, every result one that
// StoreResultOf can return.
func TestStoreOpsAndResultsAreComplete(t *testing.T) {
	t.Parallel()
	ops := observe.StoreOps()
	want := []observe.StoreOp{observe.StoreClaim, observe.StoreComplete, observe.StoreFail, observe.StoreRelease, observe.StoreExtend, observe.StoreAttach, observe.StoreGet, observe.StoreClaimBatch, observe.StoreStep}
	if !slices.Equal(ops, want) {
		t.Errorf("StoreOps() = %v, want %v", ops, want)
	}
	results := observe.StoreResults()
	seen := map[observe.StoreResult]bool{}
	for _, r := range results {
		if seen[r] {
			t.Errorf("StoreResults() lists %q twice", r)
		}
		seen[r] = true
	}
	for _, err := range []error{nil, store.ErrNotFound, store.ErrFenced, store.ErrTooLarge, store.ErrCorrupt,
		context.Canceled, store.ErrThrottled, store.ErrUnavailable, errors.New("other")} {
		if r := observe.StoreResultOf(err); !seen[r] {
			t.Errorf("StoreResultOf(%v) = %q, which StoreResults() does not list", err, r)
		}
	}
	if len(results) != 9 {
		t.Errorf("StoreResults() has %d results, want the 9 the test above produces", len(results))
	}
}
