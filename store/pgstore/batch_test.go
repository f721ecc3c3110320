package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// TestBatchOneStatement: a batch claim, a batch extend and a batch
// complete are one statement each, conflicts, refusals and their
// explanations included, each renewal with its own lease and ref, and the
// engine's batches use them (store.BatchClaimer, store.BatchCompleter).
func TestBatchOneStatement(t *testing.T) {
	t.Parallel()
	s, cnt, _, _ := countedStore(t)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key, owner string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: owner, Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000}
	}
	if res, err := s.Claim(ctx, claim("held", "other")); err != nil || !res.Acquired {
		t.Fatal(res, err)
	}
	ps := make([]store.ClaimParams, 10)
	for i := range ps {
		ps[i] = claim(fmt.Sprint("k", i), "o")
	}
	ps[9] = claim("held", "o")
	before := cnt.n.Load()
	res, errs := s.ClaimBatch(ctx, ps)
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("batch claim: %d statements, want 1", n)
	}
	for i := range ps {
		if errs[i] != nil || res[i].Acquired != (i < 9) {
			t.Errorf("claim %d: %+v, %v", i, res[i], errs[i])
		}
	}
	if res[9].Record.Owner != "other" {
		t.Errorf("the conflict's record: %+v, want the holder's", res[9].Record)
	}
	var fe *store.FencedError
	xs := make([]store.ExtendParams, 10)
	for i, p := range ps {
		xs[i] = store.ExtendParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 120_000 + int64(i)}
	}
	xs[3].Key = "absent"
	xs[5].LeaseUntil, xs[5].Ref = 0, "exec-5" // the lease kept, a ref attached
	before = cnt.n.Load()
	xerrs := s.ExtendBatch(ctx, xs)
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("batch extend: %d statements, want 1", n)
	}
	for i, err := range xerrs {
		switch i {
		case 3:
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("extend of an absent key: %v, want ErrNotFound", err)
			}
		case 9:
			if !errors.As(err, &fe) || fe.CurrentOwner != "other" || fe.Current != 1 || fe.Status != store.StatusInProgress {
				t.Errorf("extend of a key another holds: %v, want a *FencedError naming other", err)
			}
			if r, err := s.Get(ctx, "held"); err != nil || r.LeaseUntil != now+60_000 {
				t.Errorf("the refused renewal's record: %+v, %v; want its lease kept", r, err)
			}
		default:
			want, ref := xs[i].LeaseUntil, ""
			if i == 5 {
				want, ref = now+60_000, "exec-5"
			}
			if err != nil {
				t.Errorf("extend %d: %v", i, err)
			} else if r, err := s.Get(ctx, xs[i].Key); err != nil || r.Status != store.StatusInProgress || r.LeaseUntil != want || r.Ref != ref {
				t.Errorf("record %s: %+v, %v; want lease %d, ref %q", xs[i].Key, r, err, want, ref)
			}
		}
	}
	cs := make([]store.CompleteParams, 10)
	for i, p := range ps {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte(p.Key)}
	}
	cs[4].Key = "absent"
	before = cnt.n.Load()
	cerrs := s.CompleteBatch(ctx, cs)
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("batch complete: %d statements, want 1", n)
	}
	for i, err := range cerrs {
		switch i {
		case 4:
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("complete of an absent key: %v, want ErrNotFound", err)
			}
		case 9:
			if !errors.As(err, &fe) || fe.CurrentOwner != "other" {
				t.Errorf("complete of a key another holds: %v, want a *FencedError naming other", err)
			}
		default:
			if err != nil {
				t.Errorf("complete %d: %v", i, err)
			} else if r, err := s.Get(ctx, cs[i].Key); err != nil || r.Status != store.StatusCompleted || string(r.Result) != cs[i].Key {
				t.Errorf("record %s: %+v, %v", cs[i].Key, r, err)
			}
		}
	}

	// Through the engine: the batch's claims in one statement, every
	// outcome recorded.
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]idem.Identity, 16)
	for i := range ids {
		r := idem.Request{Operation: "batched", Key: fmt.Sprint("e", i)}
		if ids[i], err = r.Identity(); err != nil {
			t.Fatal(err)
		}
	}
	// The engine measures the store's clock once per ClockSync interval,
	// on its first claim: a call before the batch makes it, so that the
	// batch's statements are counted alone.
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "batched", Key: "warm"}, func(context.Context) (int, error) { return 0, nil }); err != nil {
		t.Fatal(err)
	}
	before = cnt.n.Load()
	out, oerrs := idem.DoBatch(ctx, e, ids, &idem.BatchOptions[int]{Concurrency: 1}, func(_ context.Context, i int) (int, error) { return i, nil })
	for i := range ids {
		if oerrs[i] != nil || out[i].Recorded != store.StatusCompleted {
			t.Fatalf("call %d: %+v, %v", i, out[i], oerrs[i])
		}
	}
	if n := cnt.n.Load() - before; n > 1+16 {
		t.Errorf("DoBatch of 16: %d statements, want 1 claim and at most one complete each", n)
	}
}
