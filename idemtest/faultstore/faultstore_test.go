package faultstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// FailKeys fails the calls on the keys it names, alone and inside a
// CompleteBatch, and serves the other keys; each call is counted.
func TestFailKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	s := faultstore.New(m)
	down := errors.New("down")
	s.FailKeys("complete", func(key string) error {
		if key == "b" {
			return down
		}
		return nil
	})
	var ps []store.CompleteParams
	for _, k := range []string{"a", "b", "c"} {
		r, err := s.Claim(ctx, store.ClaimParams{Key: k, Owner: "o", Fingerprint: "f", Now: 1, LeaseUntil: 1000, ExpiresAt: 10_000})
		if err != nil || !r.Acquired {
			t.Fatalf("claim %s: %+v %v", k, r, err)
		}
		ps = append(ps, store.CompleteParams{ClaimRef: store.ClaimRef{Key: k, Fence: r.Record.Fence, Owner: "o"}, ExpiresAt: 10_000, Result: []byte("ok")})
	}
	errs := s.CompleteBatch(ctx, ps)
	if errs[0] != nil || !errors.Is(errs[1], down) || errs[2] != nil {
		t.Errorf("CompleteBatch: %v, want only b's Complete to fail", errs)
	}
	if err := s.Complete(ctx, ps[1]); !errors.Is(err, down) {
		t.Errorf("Complete of b: %v, want the key's fault", err)
	}
	if got := s.Calls("complete"); got != 4 {
		t.Errorf("%d complete calls counted, want 4", got)
	}
	s.FailKeys("complete", nil)
	if err := s.Complete(ctx, ps[1]); err != nil {
		t.Errorf("Complete of b with the fault removed: %v", err)
	}
}
