package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
)

// The cases of the Stepper power: steps recorded under a claim, fenced,
// carried into a takeover, and gone with their record. Each is skipped for
// a store without [store.Stepper].

// stepper returns s's Stepper, or skips the case.
func stepper(t *testing.T, s store.Store) store.Stepper {
	t.Helper()
	st, ok := s.(store.Stepper)
	if !ok {
		t.Skip("store does not record steps (store.Stepper)")
	}
	return st
}

// recordStep records step i (name, with result or a terminal error) under
// the claim of rec at now.
func recordStep(s store.Stepper, rec *store.Record, i int, name string, result []byte, er *store.ErrorRecord, now int64) error {
	return s.RecordStep(context.Background(), store.StepParams{
		ClaimRef: store.ClaimRef{Key: rec.Key, Fence: rec.Fence, Owner: rec.Owner, Now: now},
		Index:    i, Step: store.Step{Name: name, Result: result, Err: er, At: now}})
}

// sameSteps compares two lists of steps: names, results (nil and empty
// alike), errors and times.
func sameSteps(got, want []store.Step) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d steps %v, want %d %v", len(got), stepNames(got), len(want), stepNames(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Name != w.Name || !bytes.Equal(g.Result, w.Result) || g.At != w.At {
			return fmt.Errorf("step %d = %q %q at %d, want %q %q at %d", i, g.Name, trunc(g.Result), g.At, w.Name, trunc(w.Result), w.At)
		}
		if (g.Err == nil) != (w.Err == nil) || g.Err != nil &&
			(g.Err.Code != w.Err.Code || g.Err.Message != w.Err.Message || !bytes.Equal(g.Err.Body, w.Err.Body)) {
			return fmt.Errorf("step %d (%s): Err = %+v, want %+v", i, g.Name, g.Err, w.Err)
		}
	}
	return nil
}

func stepNames(steps []store.Step) []string {
	names := make([]string, len(steps))
	for i, st := range steps {
		names[i] = st.Name
	}
	return names
}

// TestSteps: a holder's steps are recorded in order — results and terminal
// errors, binary bytes kept — and returned by Get; a retried step whose
// first reply was lost changes nothing; a step at the wrong index, or
// another name where a step stands, is refused with ErrInvalidParams and
// changes nothing. A takeover after the lease (same fingerprint) returns
// the finished steps in the claim's answer itself, and its holder records
// the next one; a takeover with another fingerprint starts with none. The
// record's other fields are the claim's, steps or not; Complete drops the
// steps, and a replay of the COMPLETED record carries none.
func TestSteps(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	st := stepper(t, s)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	charge := []byte{0, 1, 0xff, '"', 0xc3, 0x28} // binary, invalid UTF-8
	declined := &store.ErrorRecord{Code: "mail_refused", Message: "mailbox full ✓", Body: []byte(`{"smtp":552}`)}
	want := []store.Step{
		{Name: "charge", Result: charge, At: now + 1},
		{Name: "email", Err: declined, At: now + 2},
		{Name: "empty", Result: []byte{}, At: now + 3},
	}
	for i, w := range want {
		if err := recordStep(st, rec, i, w.Name, w.Result, w.Err, w.At); err != nil {
			t.Fatalf("RecordStep %d (%s): %v", i, w.Name, err)
		}
	}
	got := mustGet(t, s, key)
	if err := sameSteps(got.Steps, want); err != nil {
		t.Fatalf("Get after three steps: %v", err)
	}
	withSteps := *rec
	withSteps.Steps = want
	sameRecord(t, "record with steps", got, &withSteps)

	// A retry of the last step (its reply lost) lands nothing twice.
	if err := recordStep(st, rec, 2, "empty", []byte{}, nil, now+4); err != nil {
		t.Fatalf("retried RecordStep: %v, want nil (recorded already)", err)
	}
	for _, bad := range []struct {
		what  string
		index int
		name  string
	}{{"another name at a recorded index", 1, "sms"}, {"a gap", 4, "ledger"}, {"a step recorded already, at another index", 3, "charge"}} {
		err := recordStep(st, rec, bad.index, bad.name, []byte("x"), nil, now+5)
		if bad.index == 3 {
			// Index 3 is the next one: a second step of a recorded name is
			// the operation's own business, and lands.
			if err != nil {
				t.Fatalf("%s: %v", bad.what, err)
			}
			want = append(want, store.Step{Name: "charge", Result: []byte("x"), At: now + 5})
			continue
		}
		if !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("RecordStep with %s: %v, want ErrInvalidParams", bad.what, err)
		}
	}
	if err := sameSteps(mustGet(t, s, key).Steps, want); err != nil {
		t.Fatalf("after a retry and refused steps: %v", err)
	}

	// A takeover returns the finished steps with the claim.
	res := claimAt(t, s, key, "owner-b", fp("a"), rec.LeaseUntil)
	if !res.Acquired || !res.Takeover {
		t.Fatalf("takeover: Acquired=%v Takeover=%v", res.Acquired, res.Takeover)
	}
	if err := sameSteps(res.Record.Steps, want); err != nil {
		t.Fatalf("the takeover's answer: %v", err)
	}
	if err := sameSteps(mustGet(t, s, key).Steps, want); err != nil {
		t.Fatalf("Get after the takeover: %v", err)
	}
	cur := res.Record
	if err := recordStep(st, cur, len(want), "ledger", []byte("entry-9"), nil, rec.LeaseUntil+1); err != nil {
		t.Fatalf("the new holder's step: %v", err)
	}
	want = append(want, store.Step{Name: "ledger", Result: []byte("entry-9"), At: rec.LeaseUntil + 1})
	if err := sameSteps(mustGet(t, s, key).Steps, want); err != nil {
		t.Fatalf("after the new holder's step: %v", err)
	}

	// Complete drops the steps; the replay carries none.
	at := rec.LeaseUntil + 2
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: cur.Fence, Owner: cur.Owner, Now: at}, ExpiresAt: at + expiry, Result: []byte("done")}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got := mustGet(t, s, key); got.Status != store.StatusCompleted || len(got.Steps) != 0 {
		t.Fatalf("COMPLETED record: status %s, %d steps; want no steps", got.Status, len(got.Steps))
	}
	if res := claimAt(t, s, key, "owner-c", fp("a"), at+1); res.Acquired || len(res.Record.Steps) != 0 || string(res.Record.Result) != "done" {
		t.Fatalf("replay of a COMPLETED record: Acquired=%v, %d steps, result %q", res.Acquired, len(res.Record.Steps), res.Record.Result)
	}

	// A takeover by a request with another payload starts afresh.
	key2 := newKey(t)
	first := claimAt(t, s, key2, "owner-a", fp("a"), now).Record
	if err := recordStep(st, first, 0, "charge", []byte("ch_1"), nil, now); err != nil {
		t.Fatal(err)
	}
	other := claimAt(t, s, key2, "owner-b", fp("b"), first.LeaseUntil)
	if !other.Takeover || len(other.Record.Steps) != 0 || len(mustGet(t, s, key2).Steps) != 0 {
		t.Fatalf("takeover with another fingerprint: Takeover=%v, answer with %d steps; want none", other.Takeover, len(other.Record.Steps))
	}

	// Bad parameters are refused before anything is read.
	if err := st.RecordStep(ctx, store.StepParams{ClaimRef: store.ClaimRef{Key: key2, Fence: other.Record.Fence, Owner: "owner-b", Now: now}, Step: store.Step{Result: []byte("x")}}); !errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("RecordStep without a name: %v, want ErrInvalidParams", err)
	}
}

// TestStepFencing: a step write by a holder that lost its claim — a zombie
// after a takeover, a holder whose record was released or deleted and
// claimed afresh (fence 1 again, another owner) — is refused with a
// *FencedError naming the record's claim, and changes nothing: neither the
// new holder's steps nor the rest of the record. A step write to a settled
// record (even by its own claim) is refused the same way; one to an absent
// or expired record says ErrNotFound.
func TestStepFencing(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	st := stepper(t, s)
	ctx := context.Background()
	now := base()
	refused := func(t *testing.T, what string, err error, cur *store.Record) {
		t.Helper()
		var fe *store.FencedError
		if !errors.As(err, &fe) || !errors.Is(err, store.ErrFenced) {
			t.Fatalf("%s: %v, want a *FencedError", what, err)
		}
		if fe.Current != cur.Fence || fe.CurrentOwner != cur.Owner {
			t.Errorf("%s: FencedError names claim %d (%s), want the record's %d (%s)", what, fe.Current, fe.CurrentOwner, cur.Fence, cur.Owner)
		}
	}
	t.Run("AfterTakeover", func(t *testing.T) {
		key := newKey(t)
		zombie := claimAt(t, s, key, "zombie", fp("a"), now).Record
		if err := recordStep(st, zombie, 0, "charge", []byte("ch_1"), nil, now+1); err != nil {
			t.Fatal(err)
		}
		cur := claimAt(t, s, key, "owner-b", fp("a"), zombie.LeaseUntil).Record
		if err := recordStep(st, cur, 1, "email", []byte("sent"), nil, zombie.LeaseUntil+1); err != nil {
			t.Fatal(err)
		}
		before := mustGet(t, s, key)
		at := zombie.LeaseUntil + 2
		// The zombie's next step, at the index it knows and at the next one.
		refused(t, "the zombie's step 1", recordStep(st, zombie, 1, "email", []byte("zombie"), nil, at), cur)
		refused(t, "the zombie's step 2", recordStep(st, zombie, 2, "ledger", []byte("zombie"), nil, at), cur)
		other := *cur
		other.Owner = zombie.Owner
		refused(t, "the record's fence under another owner", recordStep(st, &other, 2, "ledger", []byte("zombie"), nil, at), cur)
		sameRecord(t, "record after the zombie's steps", mustGet(t, s, key), before)
		if err := sameSteps(mustGet(t, s, key).Steps, before.Steps); err != nil {
			t.Fatalf("steps after the zombie's writes: %v", err)
		}
		// Settled: refused even under the record's own claim.
		if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: cur.Fence, Owner: cur.Owner, Now: at}, ExpiresAt: at + expiry, Result: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		done := mustGet(t, s, key)
		err := recordStep(st, cur, 2, "ledger", []byte("late"), nil, at+1)
		var fe *store.FencedError
		if !errors.As(err, &fe) || !fe.Own() || fe.Status != store.StatusCompleted {
			t.Fatalf("a step of a COMPLETED record by its claim: %v, want a *FencedError, Own, COMPLETED", err)
		}
		sameRecord(t, "COMPLETED record after a late step", mustGet(t, s, key), done)
	})
	t.Run("AfterReleaseAndReclaim", func(t *testing.T) {
		key := newKey(t)
		first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		if err := recordStep(st, first, 0, "charge", []byte("ch_1"), nil, now); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: now + 1}}); err != nil {
			t.Fatal(err)
		}
		cur := claimAt(t, s, key, "owner-b", fp("a"), now+2).Record
		before := mustGet(t, s, key)
		refused(t, "the first holder's step into the new claim", recordStep(st, first, 0, "charge", []byte("stale"), nil, now+3), cur)
		refused(t, "the first holder's next step", recordStep(st, first, 1, "email", []byte("stale"), nil, now+3), cur)
		sameRecord(t, "new claim after the first holder's steps", mustGet(t, s, key), before)
	})
	t.Run("AfterDeletionAndReclaim", func(t *testing.T) {
		deleter, ok := s.(store.Deleter)
		if !ok {
			t.Skip("store does not implement store.Deleter")
		}
		key := newKey(t)
		first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		if err := recordStep(st, first, 0, "charge", []byte("ch_1"), nil, now); err != nil {
			t.Fatal(err)
		}
		at := first.ExpiresAt
		if err := deleter.Delete(ctx, key); err != nil { // as a TTL would, once expired
			t.Fatal(err)
		}
		cur := claimAt(t, s, key, "owner-b", fp("a"), at).Record
		before := mustGet(t, s, key)
		refused(t, "the first holder's step into the claim after deletion", recordStep(st, first, 1, "email", []byte("stale"), nil, at+1), cur)
		sameRecord(t, "new claim after the first holder's step", mustGet(t, s, key), before)
	})
	t.Run("AbsentOrExpired", func(t *testing.T) {
		key := newKey(t)
		ghost := &store.Record{Key: key, Fence: 1, Owner: "owner-a"}
		if err := recordStep(st, ghost, 0, "charge", []byte("x"), nil, now); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("step of an absent key: %v, want ErrNotFound", err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a refused step created the record: Get = %v", err)
		}
		rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		if err := recordStep(st, rec, 0, "charge", []byte("x"), nil, rec.ExpiresAt); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("step of an expired claim: %v, want ErrNotFound", err)
		}
		if r, err := s.Get(ctx, key); err == nil && len(r.Steps) != 0 {
			t.Errorf("a step landed in an expired record: %v", stepNames(r.Steps))
		}
	})
}

// TestStepsGoWithRecord: steps live and die with their record. A claim
// after a Release, after expiry (the record still present, or reclaimed
// by the backend) and after Fail starts with none, in its answer and in
// Get; Fail drops them as Complete does.
func TestStepsGoWithRecord(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	st := stepper(t, s)
	ctx := context.Background()
	now := base()
	stepped := func(t *testing.T) *store.Record {
		t.Helper()
		rec := claimAt(t, s, newKey(t), "owner-a", fp("a"), now).Record
		for i, name := range []string{"charge", "email"} {
			if err := recordStep(st, rec, i, name, []byte(name), nil, now); err != nil {
				t.Fatal(err)
			}
		}
		return rec
	}
	fresh := func(t *testing.T, what string, key string, at int64) {
		t.Helper()
		res := claimAt(t, s, key, "owner-b", fp("a"), at)
		if !res.Acquired || res.Takeover {
			t.Fatalf("%s: Acquired=%v Takeover=%v, want a fresh claim", what, res.Acquired, res.Takeover)
		}
		if len(res.Record.Steps) != 0 {
			t.Errorf("%s: the claim's answer carries old steps %v", what, stepNames(res.Record.Steps))
		}
		if got := mustGet(t, s, key); len(got.Steps) != 0 {
			t.Errorf("%s: the record carries old steps %v", what, stepNames(got.Steps))
		}
	}
	t.Run("Release", func(t *testing.T) {
		rec := stepped(t)
		if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: rec.Key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, rec.Key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after Release: %v, want ErrNotFound", err)
		}
		fresh(t, "claim after Release", rec.Key, now+2)
	})
	t.Run("Expiry", func(t *testing.T) {
		rec := stepped(t)
		fresh(t, "claim at ExpiresAt", rec.Key, rec.ExpiresAt)
	})
	t.Run("Fail", func(t *testing.T) {
		rec := stepped(t)
		at := now + 1
		if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: rec.Key, Fence: rec.Fence, Owner: rec.Owner, Now: at}, ExpiresAt: at + lease, Err: store.ErrorRecord{Code: "declined"}}); err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, s, rec.Key); got.Status != store.StatusFailed || len(got.Steps) != 0 {
			t.Fatalf("FAILED record: status %s, steps %v; want none", got.Status, stepNames(got.Steps))
		}
		if res := claimAt(t, s, rec.Key, "owner-c", fp("a"), at+1); res.Acquired || len(res.Record.Steps) != 0 {
			t.Fatalf("replay of a FAILED record: Acquired=%v, steps %v", res.Acquired, stepNames(res.Record.Steps))
		}
		fresh(t, "claim after the FAILED record expired", rec.Key, at+lease)
	})
}

// TestStepSizeLimit: a record's steps count toward the store's size limit
// (Features.MaxResultBytes) together: steps that fill the limit exactly
// are recorded byte for byte; one byte more, in a step of its own or in a
// single step over the limit, fails with a *TooLargeError and changes
// nothing. A store without a limit of its own records 1 MiB of steps.
func TestStepSizeLimit(t *testing.T, f Features, newStore NewStore) {
	s := newStore(t)
	st := stepper(t, s)
	limit := f.MaxResultBytes
	if f.MaxStepBytes != 0 {
		limit = f.MaxStepBytes
	}
	if limit == 0 {
		limit = 1 << 20
	}
	// Step sizes count their names: "one" and "two" are 3 bytes each.
	half := limit / 2
	a, b := make([]byte, half-3), make([]byte, limit-half-3)
	for i := range a {
		a[i] = byte(i*7 + i>>8)
	}
	for i := range b {
		b[i] = byte(i*11 + i>>8)
	}
	now := base()
	rec := claimAt(t, s, newKey(t), "owner-a", fp("a"), now).Record
	want := []store.Step{{Name: "one", Result: a, At: now}, {Name: "two", Result: b, At: now}}
	for i, w := range want {
		if err := recordStep(st, rec, i, w.Name, w.Result, nil, now); err != nil {
			t.Fatalf("step %d of %d bytes (%d in all, the limit): %v", i, len(w.Result), limit, err)
		}
	}
	if err := sameSteps(mustGet(t, s, rec.Key).Steps, want); err != nil {
		t.Fatalf("steps filling the limit: %v", err)
	}
	if f.MaxResultBytes == 0 && f.MaxStepBytes == 0 {
		return
	}
	before := mustGet(t, s, rec.Key)
	err := recordStep(st, rec, 2, "x", []byte{}, nil, now+1) // one byte: its name
	var tl *store.TooLargeError
	if !errors.Is(err, store.ErrTooLarge) || !errors.As(err, &tl) {
		t.Fatalf("a step one byte over the record's limit: %v, want *TooLargeError", err)
	}
	sameRecord(t, "record after a refused step", mustGet(t, s, rec.Key), before)
	if err := sameSteps(mustGet(t, s, rec.Key).Steps, want); err != nil {
		t.Fatalf("steps after a refused step: %v", err)
	}
	alone := claimAt(t, s, newKey(t), "owner-a", fp("a"), now).Record
	big := append(append(make([]byte, 0, limit), a...), b...) // with its name, 1 byte over
	big = append(big, "xxxx"...)
	if err := recordStep(st, alone, 0, "big", big, nil, now); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("one step over the limit: %v, want ErrTooLarge", err)
	}
	if got := mustGet(t, s, alone.Key); len(got.Steps) != 0 {
		t.Fatalf("a refused step landed: %v", stepNames(got.Steps))
	}
}

// TestStepsListing: listing is unaffected by steps: a record with steps
// is listed by the same rules as one without (every record, IN_PROGRESS,
// stuck once its lease passed; not COMPLETED or FAILED), and the same
// holds after a takeover carried them. Skipped for stores without
// store.Lister.
func TestStepsListing(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	st := stepper(t, s)
	lister, ok := s.(store.Lister)
	if !ok {
		t.Skip("store does not implement store.Lister")
	}
	ctx := context.Background()
	now := base()
	mine := map[string]bool{}
	mk := func(steps int, leaseLeft int64) *store.Record {
		key := newKey(t)
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: "o", Now: now - 1000, LeaseUntil: now + leaseLeft, ExpiresAt: now + expiry})
		if err != nil {
			t.Fatal(err)
		}
		for i := range steps {
			if err := recordStep(st, res.Record, i, fmt.Sprint("step-", i), []byte("r"), nil, now-1000); err != nil {
				t.Fatal(err)
			}
		}
		mine[key] = true
		return res.Record
	}
	plainLive, steppedLive := mk(0, lease), mk(3, lease)
	plainStuck, steppedStuck := mk(0, -1), mk(2, -1)
	takenOver := mk(2, -1)
	if res := claimAt(t, s, takenOver.Key, "o2", fp("a"), now); !res.Takeover || len(res.Record.Steps) != 2 {
		t.Fatalf("takeover of a record with steps: Takeover=%v, %d steps", res.Takeover, len(res.Record.Steps))
	}
	collect := func(p store.ListParams) []string {
		var got []string
		p.Now, p.Limit = now, 2
		for range 10_000 {
			page, err := lister.List(ctx, p)
			if err != nil {
				t.Fatalf("List(%+v): %v", p, err)
			}
			for _, r := range page.Records {
				if mine[r.Key] {
					got = append(got, r.Key)
				}
			}
			if page.Next == "" {
				return got
			}
			p.Cursor = page.Next
		}
		t.Fatal("List never ended")
		return nil
	}
	set := func(recs ...*store.Record) map[string]bool {
		m := map[string]bool{}
		for _, r := range recs {
			m[r.Key] = true
		}
		return m
	}
	for _, c := range []struct {
		what string
		p    store.ListParams
		want map[string]bool
	}{
		{"every record", store.ListParams{}, set(plainLive, steppedLive, plainStuck, steppedStuck, takenOver)},
		{"IN_PROGRESS", store.ListParams{Status: store.StatusInProgress}, set(plainLive, steppedLive, plainStuck, steppedStuck, takenOver)},
		{"stuck", store.ListParams{Stuck: true}, set(plainStuck, steppedStuck)},
		{"COMPLETED", store.ListParams{Status: store.StatusCompleted}, set()},
	} {
		got := map[string]bool{}
		for _, k := range collect(c.p) {
			got[k] = true
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("List(%s) found %d of this test's records, want %d (steps or not)", c.what, len(got), len(c.want))
		}
	}
}
