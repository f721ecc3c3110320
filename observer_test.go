package idem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

func TestStoreResultOf(t *testing.T) {
	t.Parallel()
	unavailable := fmt.Errorf("redisstore: claim k: %w: %w", store.ErrUnavailable, errors.New("dial tcp: connection refused"))
	for _, tc := range []struct {
		name string
		err  error
		want idem.StoreResult
	}{
		{"nil is ok", nil, idem.StoreOK},
		{"not found", fmt.Errorf("get: %w", store.ErrNotFound), idem.StoreNotFound},
		{"fenced error", &store.FencedError{Key: "k", Fence: 1, Current: 2}, idem.StoreFenced},
		{"too large error", &store.TooLargeError{Key: "k", Size: 2, Limit: 1}, idem.StoreTooLarge},
		{"corrupt error", &store.CorruptError{Key: "k", Reason: "crc"}, idem.StoreCorrupt},
		{"backend unreachable", unavailable, idem.StoreUnavailable},
		{"deadline, unwrapped", context.DeadlineExceeded, idem.StoreUnavailable},
		{"deadline, wrapped as unavailable", fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded), idem.StoreUnavailable},
		{"caller cancelled, wrapped as unavailable", fmt.Errorf("%w: %w", store.ErrUnavailable, context.Canceled), idem.StoreCanceled},
		{"untranslated backend error", errors.New("ERR unknown command"), idem.StoreOtherError},
		{"as the engine wraps it", &idem.StoreError{Op: idem.StoreClaim, Key: "k", Err: unavailable}, idem.StoreUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := idem.StoreResultOf(tc.err); got != tc.want {
				t.Errorf("StoreResultOf(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// Exporters index by these lists: every value once, every result one that
// StoreResultOf can return.
func TestStoreOpsAndResultsAreComplete(t *testing.T) {
	t.Parallel()
	ops := idem.StoreOps()
	want := []idem.StoreOp{idem.StoreClaim, idem.StoreComplete, idem.StoreFail, idem.StoreRelease, idem.StoreExtend, idem.StoreAttach, idem.StoreGet, idem.StoreClaimBatch}
	if !slices.Equal(ops, want) {
		t.Errorf("StoreOps() = %v, want %v", ops, want)
	}
	results := idem.StoreResults()
	seen := map[idem.StoreResult]bool{}
	for _, r := range results {
		if seen[r] {
			t.Errorf("StoreResults() lists %q twice", r)
		}
		seen[r] = true
	}
	for _, err := range []error{nil, store.ErrNotFound, store.ErrFenced, store.ErrTooLarge, store.ErrCorrupt,
		context.Canceled, store.ErrUnavailable, errors.New("other")} {
		if r := idem.StoreResultOf(err); !seen[r] {
			t.Errorf("StoreResultOf(%v) = %q, which StoreResults() does not list", err, r)
		}
	}
	if len(results) != 8 {
		t.Errorf("StoreResults() has %d results, want the 8 the test above produces", len(results))
	}
}
