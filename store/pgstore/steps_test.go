package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// TestOneStatementPerStep: a step is one UPDATE; a retried step (its
// first reply lost) costs the UPDATE and the read that explains it; a
// takeover returns the steps in the claim's answer (INSERT, then the
// upsert) and so does a batch's claim (one statement).
func TestOneStatementPerStep(t *testing.T) {
	s, cnt, pool, table := countedStore(t)
	ctx := context.Background()
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	op := func(ctx context.Context) (string, error) {
		a, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil })
		if err != nil {
			return "", err
		}
		b, err := idem.Step(ctx, "email", func(context.Context) (string, error) { return "sent", nil })
		return a + b, err
	}
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "order", Key: "warm"}, op); err != nil { // reads the clock
		t.Fatal(err)
	}
	before := cnt.n.Load()
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "order", Key: "k1"}, op); err != nil {
		t.Fatal(err)
	}
	if n := cnt.n.Load() - before; n != 4 {
		t.Errorf("a call with two steps sent %d statements, want 4 (claim, a step each, complete)", n)
	}

	now := time.Now().UnixMilli()
	for _, batch := range []bool{false, true} {
		key := map[bool]string{false: "single", true: "batch"}[batch]
		claim := store.ClaimParams{Key: key, Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 60_000}
		res, err := s.Claim(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		step := store.StepParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: "a", Now: now + 1}, Step: store.Step{Name: "charge", Result: []byte{0, 0xff}, At: now + 1}}
		before = cnt.n.Load()
		if err := s.RecordStep(ctx, step); err != nil {
			t.Fatal(err)
		}
		if n := cnt.n.Load() - before; n != 1 {
			t.Errorf("RecordStep sent %d statements, want 1", n)
		}
		before = cnt.n.Load()
		if err := s.RecordStep(ctx, step); err != nil {
			t.Fatalf("retried step: %v", err)
		}
		if n := cnt.n.Load() - before; n != 2 {
			t.Errorf("a retried RecordStep sent %d statements, want 2 (the UPDATE, the read explaining it)", n)
		}
		claim.Owner, claim.Now = "b", now+10
		before = cnt.n.Load()
		want := int64(2)
		if batch {
			var errs []error
			var rs []store.ClaimResult
			rs, errs = s.ClaimBatch(ctx, []store.ClaimParams{claim})
			res, err, want = rs[0], errs[0], 1
		} else {
			res, err = s.Claim(ctx, claim)
		}
		if err != nil || !res.Takeover || len(res.Record.Steps) != 1 || string(res.Record.Steps[0].Result) != "\x00\xff" {
			t.Fatalf("%s takeover: %+v, %v; want the step carried", key, res, err)
		}
		if n := cnt.n.Load() - before; n != want {
			t.Errorf("%s takeover sent %d statements, want %d", key, n, want)
		}
		if got, err := s.Get(ctx, key); err != nil || len(got.Steps) != 1 {
			t.Fatalf("%s: Get after the takeover: %+v, %v", key, got, err)
		}
	}

	// A damaged steps column fails closed.
	if _, err := pool.Exec(ctx, "UPDATE "+table+` SET steps = '[{"name":"x","at":1,"size":99,"result":null}]' WHERE key = 'single'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "single"); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Get of a row whose step size disagrees: %v, want ErrCorrupt", err)
	}
}
