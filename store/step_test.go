package store_test

import (
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
)

// The shared step rules of ApplyClaim, ApplyStep, ApplyComplete and
// ApplyFail, which memstore and boltstore decide by; storetest holds every
// store to the same rules through the Stepper power.
func TestApplyStep(t *testing.T) {
	t.Parallel()
	now := int64(1_000_000)
	p := store.ClaimParams{Key: "k", Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 1000}
	_, r := store.ApplyClaim(nil, p)
	step := func(i int, name, result string) store.StepParams {
		return store.StepParams{ClaimRef: store.ClaimRef{Key: "k", Fence: r.Fence, Owner: r.Owner, Now: now}, Index: i,
			Step: store.Step{Name: name, Result: []byte(result), At: now}}
	}
	for i, name := range []string{"charge", "email"} {
		if changed, err := store.ApplyStep(r, step(i, name, name+"-result"), 64); err != nil || !changed {
			t.Fatalf("step %d: changed=%v, %v", i, changed, err)
		}
	}
	if changed, err := store.ApplyStep(r, step(1, "email", "email-result"), 64); err != nil || changed {
		t.Fatalf("retried step: changed=%v, %v; want nothing to write", changed, err)
	}
	for _, bad := range []store.StepParams{step(1, "ledger", "x"), step(3, "ledger", "x")} {
		if _, err := store.ApplyStep(r, bad, 64); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("step %q at index %d of 2: %v, want ErrInvalidParams", bad.Step.Name, bad.Index, err)
		}
	}
	// 6+13 + 5+12 = 36 bytes held; a step of 6+23 more is over 64.
	var tl *store.TooLargeError
	if _, err := store.ApplyStep(r, step(2, "ledger", "01234567890123456789012"), 64); !errors.As(err, &tl) || tl.Size != 65 {
		t.Fatalf("step over the limit: %v, want a TooLargeError of 65 bytes", err)
	}
	if len(r.Steps) != 2 || r.Size() != 36 {
		t.Fatalf("record after refusals: %d steps, %d bytes; want 2 and 36", len(r.Steps), r.Size())
	}

	// A takeover carries the steps (a copy) when the fingerprint is the
	// same; another fingerprint, or a record expired, starts with none.
	later := p
	later.Owner, later.Now, later.LeaseUntil = "b", now+10, now+20
	res, w := store.ApplyClaim(r, later)
	if !res.Takeover || len(w.Steps) != 2 || len(res.Record.Steps) != 2 || w.Steps[1].Name != "email" {
		t.Fatalf("takeover: %+v, record steps %v", res, w.Steps)
	}
	w.Steps[0].Result[0] = 'X'
	if r.Steps[0].Result[0] == 'X' || res.Record.Steps[0].Result[0] == 'X' {
		t.Fatal("takeover shares the old record's steps")
	}
	other := later
	other.Fingerprint = "other"
	if _, w := store.ApplyClaim(r, other); len(w.Steps) != 0 {
		t.Fatalf("takeover with another fingerprint kept %d steps", len(w.Steps))
	}
	expired := later
	expired.Now = r.ExpiresAt
	if res, w := store.ApplyClaim(r, expired); res.Takeover || len(w.Steps) != 0 {
		t.Fatalf("claim of an expired record kept %d steps", len(w.Steps))
	}

	// Settling drops the steps.
	c := r.Clone()
	store.ApplyComplete(c, store.CompleteParams{ClaimRef: step(0, "x", "").ClaimRef, Result: []byte("ok")})
	f := r.Clone()
	store.ApplyFail(f, store.FailParams{ClaimRef: step(0, "x", "").ClaimRef, Err: store.ErrorRecord{Code: "c"}})
	if c.Steps != nil || f.Steps != nil {
		t.Fatalf("settled records keep steps: COMPLETED %v, FAILED %v", c.Steps, f.Steps)
	}
}

func TestStepParamsCheck(t *testing.T) {
	t.Parallel()
	ok := store.StepParams{ClaimRef: store.ClaimRef{Key: "k"}, Step: store.Step{Name: "s", Result: []byte("r")}}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(p *store.StepParams){
		"From":          func(p *store.StepParams) { p.From = store.StatusCompleted },
		"no name":       func(p *store.StepParams) { p.Step.Name = "" },
		"negative":      func(p *store.StepParams) { p.Index = -1 },
		"result, error": func(p *store.StepParams) { p.Step.Err = &store.ErrorRecord{Code: "c"} },
	}
	for name, change := range bad {
		p := ok
		change(&p)
		if err := p.Check(); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: %v, want ErrInvalidParams", name, err)
		}
	}
}
