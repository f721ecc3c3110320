// Package storetest is the idem store contract in executable form: one
// conformance suite that every store, ours or a user's, runs with a
// constructor.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20},
//			func(t *testing.T) store.Store { return newIsolatedStore(t) })
//	}
//
// (The example of Run has it in full, compiled with the package's tests.)
//
// Every case is also exported on its own (TestClaim, TestFencing, ...), so a
// store can run a subset while it is being built. The constructor must give
// each call an isolated store (a fresh table, key prefix, schema or file)
// and register its own cleanup with t.Cleanup.
//
// Times passed to the store are milliseconds a day ahead of the wall clock,
// moved by the suite, never by sleeping: a store must decide expiry and
// leases from the Now it is given. Backend TTLs set from those times lie in
// the future, so they never fire during a run.
//
// Goroutine leak checks belong in the store package's TestMain
// (goleak.VerifyTestMain), where every test has ended. The suite imports
// porcupine for its linearizability check; production code never imports
// this package, so neither reaches a production binary.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// Features tells the suite what the store can do and how hard to push it.
// Zero fields take the defaults given.
type Features struct {
	// MaxResultBytes is the largest result the store accepts, and the
	// largest size of a record's steps taken together ([store.Stepper]).
	// The suite stores exactly that many bytes, then one more, which must
	// fail with idem.ErrTooLarge. Zero means the store has no limit of its
	// own: the suite stores 1 MiB and skips the one-over case.
	MaxResultBytes int
	// MaxStepBytes, when not zero, is the limit of a record's steps where
	// it differs from MaxResultBytes: a store that keeps large results
	// elsewhere (DynamoDB with a Spiller) but its steps in the record.
	MaxStepBytes int
	// StormGoroutines is how many goroutines race for one key. Default 64.
	StormGoroutines int
	// StormRounds is how many keys they race for, one after another.
	// Default 5.
	StormRounds int
	// ManyKeys is how many distinct keys the repeats case uses. Default 200.
	ManyKeys int
	// LinClients and LinOps size the linearizability check. Defaults 16
	// clients and 5,000 operations.
	LinClients, LinOps int
	// LinTimeout bounds the linearizability search. Default 2m.
	LinTimeout time.Duration
}

func (f Features) withDefaults() Features {
	if f.StormGoroutines <= 0 {
		f.StormGoroutines = 64
	}
	if f.StormRounds <= 0 {
		f.StormRounds = 5
	}
	if f.ManyKeys <= 0 {
		f.ManyKeys = 200
	}
	if f.LinClients <= 0 {
		f.LinClients = 16
	}
	if f.LinOps <= 0 {
		f.LinOps = 5000
	}
	if f.LinTimeout <= 0 {
		f.LinTimeout = 2 * time.Minute
	}
	return f
}

// NewStore returns an isolated store for one test, with its cleanup
// registered on t.
type NewStore func(t *testing.T) store.Store

// Case is one exported conformance case.
type Case func(t *testing.T, f Features, newStore NewStore)

// Cases lists every case by name, in the order Run runs them.
var Cases = []struct {
	Name string
	Run  Case
}{
	{"Claim", TestClaim},
	{"ClaimConflict", TestClaimConflict},
	{"ClaimRetryBySameOwner", TestClaimRetryBySameOwner},
	{"CompleteAndReplay", TestCompleteAndReplay},
	{"FailAndReplay", TestFailAndReplay},
	{"TextIsUTF8", TestTextIsUTF8},
	{"Release", TestRelease},
	{"NotFound", TestNotFound},
	{"TakeoverOnlyAfterLease", TestTakeoverOnlyAfterLease},
	{"NoTakeover", TestNoTakeover},
	{"Hold", TestHold},
	{"ClaimBatch", TestClaimBatch},
	{"ClaimBatchMatchesClaim", TestClaimBatchMatchesClaim},
	{"CompleteBatch", TestCompleteBatch},
	{"ExtendBatch", TestExtendBatch},
	{"BatchOwnParams", TestBatchOwnParams},
	{"BatchStorm", TestBatchStorm},
	{"Fencing", TestFencing},
	{"ReclaimAfterDeletion", TestReclaimAfterDeletion},
	{"Extend", TestExtend},
	{"Attach", TestAttach},
	{"ExtendFrom", TestExtendFrom},
	{"Resettle", TestResettle},
	{"ExpiryBoundary", TestExpiryBoundary},
	{"ResultSizeLimit", TestResultSizeLimit},
	{"GoldenRecords", TestGoldenRecords},
	{"Steps", TestSteps},
	{"StepFencing", TestStepFencing},
	{"StepsGoWithRecord", TestStepsGoWithRecord},
	{"StepSizeLimit", TestStepSizeLimit},
	{"StepsListing", TestStepsListing},
	{"EngineMismatchEveryPath", TestEngineMismatchEveryPath},
	{"EngineReplay", TestEngineReplay},
	{"Storm", TestStorm},
	{"ManyKeysWithRepeats", TestManyKeysWithRepeats},
	{"Linearizability", TestLinearizability},
	{"Admin", TestAdmin},
}

// Run runs every case against stores made by newStore.
func Run(t *testing.T, f Features, newStore NewStore) {
	t.Helper()
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, f, newStore) })
	}
}

// base is the suite's "now": a day ahead of the wall clock, whole seconds.
func base() int64 {
	return time.Now().Add(24 * time.Hour).Truncate(time.Second).UnixMilli()
}

var keySeq atomic.Uint64

// newKey returns a fresh, well-formed store key unique to this process run.
func newKey(t *testing.T) string {
	n := keySeq.Add(1)
	k, err := idem.NewStoreKey("storetest", fmt.Sprintf("r%x", rand.Uint32()), fmt.Appendf(nil, "%s/%d", t.Name(), n))
	if err != nil {
		t.Fatal(err)
	}
	return k.String()
}

func fp(s string) string { return digest(s) }

// digest is the lowercase hex SHA-256 of s, as a fingerprint is made.
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

const (
	lease  = 10_000    // ms
	expiry = 3_600_000 // ms
)

func claimAt(t *testing.T, s store.Store, key, owner, fingerprint string, now int64) store.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), store.ClaimParams{
		Key: key, Fingerprint: fingerprint, Owner: owner, Now: now,
		LeaseUntil: now + lease, ExpiresAt: now + expiry,
	})
	if err != nil {
		t.Fatalf("Claim(%s, owner %s, now %d): %v", key, owner, now, err)
	}
	if res.Record == nil {
		t.Fatalf("Claim(%s) returned no record", key)
	}
	return res
}

func mustGet(t *testing.T, s store.Store, key string) *store.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return r
}

// sameRecord compares the fields every store must keep exactly.
func sameRecord(t *testing.T, what string, got, want *store.Record) {
	t.Helper()
	g, w := *got, *want
	// Stores may return nil or empty for an absent result; compare bytes.
	if !bytes.Equal(g.Result, w.Result) {
		t.Errorf("%s: Result = %q, want %q", what, trunc(g.Result), trunc(w.Result))
	}
	g.Result, w.Result = nil, nil
	if !reflect.DeepEqual(g.Err, w.Err) {
		if g.Err == nil || w.Err == nil || g.Err.Code != w.Err.Code || g.Err.Message != w.Err.Message || !bytes.Equal(g.Err.Body, w.Err.Body) {
			t.Errorf("%s: Err = %+v, want %+v", what, g.Err, w.Err)
		}
	}
	g.Err, w.Err = nil, nil
	if err := sameSteps(g.Steps, w.Steps); err != nil {
		t.Errorf("%s: %v", what, err)
	}
	g.Steps, w.Steps = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}

func trunc(b []byte) []byte {
	if len(b) > 40 {
		return append(b[:40:40], "..."...)
	}
	return b
}

// TestClaim: a claim of an absent key acquires it with fence 1 and stores
// every field given.
func TestClaim(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	res := claimAt(t, s, key, "owner-a", fp("a"), now)
	if !res.Acquired || res.Takeover {
		t.Fatalf("claim of an absent key: Acquired=%v Takeover=%v, want true false", res.Acquired, res.Takeover)
	}
	want := &store.Record{Key: key, Status: store.StatusInProgress, Fence: 1, Owner: "owner-a",
		LeaseUntil: now + lease, ExpiresAt: now + expiry, Fingerprint: fp("a"), CreatedAt: now, Version: store.RecordVersion}
	sameRecord(t, "claim result", res.Record, want)
	sameRecord(t, "Get after claim", mustGet(t, s, key), want)
}

// TestClaimConflict: a claim of a live key by another owner acquires
// nothing, changes nothing, and returns the existing record — fingerprint
// included — in the same call, whatever fingerprint it carried.
func TestClaimConflict(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	for _, f := range []string{fp("a"), fp("b"), ""} {
		res := claimAt(t, s, key, "owner-b", f, now+lease-1)
		if res.Acquired {
			t.Fatalf("claim with fingerprint %q of a live key acquired it", f)
		}
		sameRecord(t, "conflict record", res.Record, first)
	}
	sameRecord(t, "Get after conflicts", mustGet(t, s, key), first)
}

// TestClaimRetryBySameOwner: a retried claim whose first attempt was
// applied (reply lost) is recognised as the owner's own: acquired, same
// fence.
func TestClaimRetryBySameOwner(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	again := claimAt(t, s, key, "owner-a", fp("a"), now+5)
	if !again.Acquired || again.Takeover || again.Record.Fence != first.Fence {
		t.Fatalf("retry by the same owner: Acquired=%v Takeover=%v fence %d, want true false %d",
			again.Acquired, again.Takeover, again.Record.Fence, first.Fence)
	}
	// The same owner with another payload is a conflict, not its claim.
	other := claimAt(t, s, key, "owner-a", fp("z"), now+6)
	if other.Acquired {
		t.Fatal("same owner with a different fingerprint acquired the key")
	}
}

// TestCompleteAndReplay: Complete stores the result; a later claim gets the
// COMPLETED record with its result in the same call.
func TestCompleteAndReplay(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	result := []byte{0, 1, 2, 0xff, '"', '\\', 0xc3, 0x28} // binary, invalid UTF-8
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 7}, ExpiresAt: now + 7 + expiry, Result: result}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := *rec
	want.Status, want.Result, want.CompletedAt, want.ExpiresAt = store.StatusCompleted, result, now+7, now+7+expiry
	sameRecord(t, "Get after Complete", mustGet(t, s, key), &want)
	for _, f := range []string{fp("a"), fp("b")} {
		res := claimAt(t, s, key, "owner-b", f, now+lease+100) // lease passed: irrelevant once COMPLETED
		if res.Acquired {
			t.Fatalf("claim of a COMPLETED key (fingerprint %s) acquired it", f[:8])
		}
		sameRecord(t, "replay record", res.Record, &want)
	}
	// An empty result is a result.
	key2 := newKey(t)
	rec2 := claimAt(t, s, key2, "owner-a", "", now).Record
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key2, Fence: rec2.Fence, Owner: rec2.Owner, Now: now}, ExpiresAt: now + expiry, Result: []byte{}}); err != nil {
		t.Fatalf("Complete with an empty result: %v", err)
	}
	if got := mustGet(t, s, key2); got.Status != store.StatusCompleted || len(got.Result) != 0 {
		t.Fatalf("empty result stored as status %v, %d bytes", got.Status, len(got.Result))
	}
}

// TestFailAndReplay: Fail stores the terminal error; a later claim gets it.
func TestFailAndReplay(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	er := store.ErrorRecord{Code: "card_declined", Message: "card declined: insufficient funds ✓", Body: []byte(`{"decline":"funds"}`)}
	if err := s.Fail(context.Background(), store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 3}, ExpiresAt: now + 3 + expiry, Err: er}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	want := *rec
	want.Status, want.Err, want.CompletedAt, want.ExpiresAt = store.StatusFailed, &er, now+3, now+3+expiry
	sameRecord(t, "Get after Fail", mustGet(t, s, key), &want)
	res := claimAt(t, s, key, "owner-b", fp("a"), now+lease+1)
	if res.Acquired {
		t.Fatal("claim of a FAILED key acquired it")
	}
	sameRecord(t, "replayed failure", res.Record, &want)
}

// TestTextIsUTF8: an error's code and message, and a step's name, are
// text: a Fail or a step whose text is not valid UTF-8 is refused with
// ErrInvalidParams, whatever the store could have kept, and nothing
// changes (not stored with its bytes replaced, which would replay another
// error than the one written). Its body is bytes: anything goes there.
func TestTextIsUTF8(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	ref := store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}
	for _, er := range []store.ErrorRecord{
		{Code: "bad\xff", Message: "declined"},
		{Code: "card_declined", Message: "reply: \xfe\xff\x00"},
	} {
		err := s.Fail(ctx, store.FailParams{ClaimRef: ref, ExpiresAt: now + expiry, Err: er})
		if !errors.Is(err, store.ErrInvalidParams) {
			t.Fatalf("Fail with code %q, message %q: %v, want ErrInvalidParams", er.Code, er.Message, err)
		}
		sameRecord(t, "record after a refused Fail", mustGet(t, s, key), rec)
	}
	binary := store.ErrorRecord{Code: "upstream", Message: "binary detail in the body", Body: []byte{0xff, 0xfe, 0, 1}}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: ref, ExpiresAt: now + 1 + expiry, Err: binary}); err != nil {
		t.Fatalf("Fail with a binary body: %v", err)
	}
	want := *rec
	want.Status, want.Err, want.CompletedAt, want.ExpiresAt = store.StatusFailed, &binary, now+1, now+1+expiry
	sameRecord(t, "record after a Fail with a binary body", mustGet(t, s, key), &want)
	st, ok := s.(store.Stepper)
	if !ok {
		return
	}
	srec := claimAt(t, s, newKey(t), "owner-a", fp("a"), now).Record
	if err := recordStep(st, srec, 0, "charge\xff", []byte("1"), nil, now+1); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("a step named with invalid UTF-8: %v, want ErrInvalidParams", err)
	}
	if err := recordStep(st, srec, 0, "charge", nil, &store.ErrorRecord{Code: "declined", Message: "\xff"}, now+1); !errors.Is(err, store.ErrInvalidParams) {
		t.Fatalf("a step whose error message is invalid UTF-8: %v, want ErrInvalidParams", err)
	}
	if got := mustGet(t, s, srec.Key); len(got.Steps) != 0 {
		t.Fatalf("a refused step landed: %v", stepNames(got.Steps))
	}
}

// TestRelease: Release deletes the claim so that a retry acquires at once.
func TestRelease(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	if err := s.Release(context.Background(), store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Get(context.Background(), key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after Release: %v, want ErrNotFound", err)
	}
	res := claimAt(t, s, key, "owner-b", fp("b"), now+2)
	if !res.Acquired || res.Record.Owner != "owner-b" {
		t.Fatalf("claim after Release: Acquired=%v owner %s", res.Acquired, res.Record.Owner)
	}
}

// TestNotFound: every fenced write and Get of an absent key says
// ErrNotFound.
func TestNotFound(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	checks := map[string]error{
		"Complete": s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "owner-a", Now: now}, ExpiresAt: now + expiry, Result: []byte("x")}),
		"Fail":     s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "owner-a", Now: now}, ExpiresAt: now + expiry, Err: store.ErrorRecord{Code: "c"}}),
		"Release":  s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "owner-a", Now: now}}),
		"Extend":   s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "owner-a", Now: now}, LeaseUntil: now + lease}),
	}
	_, checks["Get"] = s.Get(ctx, key)
	for name, err := range checks {
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s of an absent key: %v, want ErrNotFound", name, err)
		}
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a write to an absent key created it: Get = %v", err)
	}
}

// TestTakeoverOnlyAfterLease: an IN_PROGRESS record is taken over at
// LeaseUntil exactly, never a millisecond before, and the fence grows by
// one.
func TestTakeoverOnlyAfterLease(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	if res := claimAt(t, s, key, "owner-b", fp("a"), first.LeaseUntil-1); res.Acquired {
		t.Fatal("claim one millisecond before the lease ended took the key over")
	}
	res := claimAt(t, s, key, "owner-b", fp("a"), first.LeaseUntil)
	if !res.Acquired || !res.Takeover {
		t.Fatalf("claim at LeaseUntil: Acquired=%v Takeover=%v, want true true", res.Acquired, res.Takeover)
	}
	if res.Record.Fence != first.Fence+1 || res.Record.Owner != "owner-b" || res.Record.CreatedAt != first.LeaseUntil {
		t.Fatalf("takeover record: fence %d owner %s created %d; want fence %d owner owner-b created %d",
			res.Record.Fence, res.Record.Owner, res.Record.CreatedAt, first.Fence+1, first.LeaseUntil)
	}
}

// TestNoTakeover: a claim with NoTakeover (made by an engine that cannot
// trust its clock) never replaces an IN_PROGRESS record, neither past its
// lease nor past its expiry: it is a conflict that writes nothing, or the
// caller's own claim, acquired unchanged. Through ClaimBatch too, when the
// store claims in batches. Settled records are claimed as usual, and the
// same claim without NoTakeover takes the key over.
func TestNoTakeover(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	hold := func(owner string, at int64) store.ClaimParams {
		return store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: owner, Now: at, LeaseUntil: at + lease, ExpiresAt: at + expiry, NoTakeover: true}
	}
	for _, c := range []struct {
		name string
		p    store.ClaimParams
	}{
		{"past its lease", hold("owner-b", first.LeaseUntil)},
		{"past its expiry", hold("owner-b", first.ExpiresAt+1)},
	} {
		res, err := s.Claim(ctx, c.p)
		if err != nil {
			t.Fatalf("NoTakeover claim %s: %v", c.name, err)
		}
		if res.Acquired || res.Takeover || res.Record == nil || res.Record.Fence != first.Fence || res.Record.Owner != "owner-a" {
			t.Fatalf("NoTakeover claim %s: acquired %v takeover %v record %+v; want a conflict with owner-a's claim", c.name, res.Acquired, res.Takeover, res.Record)
		}
		sameRecord(t, "record after a NoTakeover claim "+c.name, mustGet(t, s, key), first)
		if bc, ok := s.(store.BatchClaimer); ok {
			rs, errs := bc.ClaimBatch(ctx, []store.ClaimParams{c.p})
			if len(rs) != 1 || len(errs) != 1 || errs[0] != nil || rs[0].Acquired || rs[0].Record == nil || rs[0].Record.Owner != "owner-a" {
				t.Fatalf("NoTakeover ClaimBatch %s: %+v %v; want a conflict with owner-a's claim", c.name, rs, errs)
			}
			sameRecord(t, "record after a NoTakeover ClaimBatch "+c.name, mustGet(t, s, key), first)
		}
	}
	own, err := s.Claim(ctx, hold("owner-a", first.LeaseUntil))
	if err != nil {
		t.Fatal(err)
	}
	if !own.Acquired || own.Takeover || own.Record.Fence != first.Fence {
		t.Fatalf("owner-a's own retry with NoTakeover: acquired %v takeover %v fence %d; want acquired, unchanged fence %d", own.Acquired, own.Takeover, own.Record.Fence, first.Fence)
	}
	sameRecord(t, "record after the owner's own NoTakeover retry", mustGet(t, s, key), first)

	// Without NoTakeover the lease decides; a settled record is claimed
	// as usual with it.
	took := claimAt(t, s, key, "owner-b", fp("a"), first.LeaseUntil)
	if !took.Acquired || !took.Takeover {
		t.Fatalf("claim past the lease without NoTakeover: acquired %v takeover %v, want a takeover", took.Acquired, took.Takeover)
	}
	at := first.LeaseUntil
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: took.Record.Fence, Owner: "owner-b", Now: at}, ExpiresAt: at + 1000, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, hold("owner-c", at+1000)); err != nil || !res.Acquired || res.Takeover || res.Record.Fence != took.Record.Fence+1 {
		t.Fatalf("NoTakeover claim of an expired COMPLETED record: %+v, %v; want acquired with fence %d", res, err, took.Record.Fence+1)
	}
}

// TestHold: a claim made with ClaimParams.Hold (the takeover policy Hold)
// is stored with Record.Hold, which Extend and Complete keep. Past its
// lease no claim takes it over (through ClaimBatch neither): it stays
// IN_PROGRESS with its claim, and a Lister lists it as stuck with Hold
// set, so an operator sees why it waits. Its holder's fenced writes still
// land after the lease. Past its expiry it is claimed as any expired
// record, and a claim without Hold writes a record without it.
func TestHold(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	now := base()
	heldClaim := func(key, owner string, at int64) store.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: owner, Now: at, LeaseUntil: at + lease, ExpiresAt: at + expiry, Hold: true})
		if err != nil {
			t.Fatalf("held claim by %s: %v", owner, err)
		}
		return res
	}
	key := newKey(t)
	first := heldClaim(key, "owner-a", now)
	if !first.Acquired || !first.Record.Hold {
		t.Fatalf("held claim of an absent key: acquired %v, record %+v; want acquired with Hold", first.Acquired, first.Record)
	}
	if got := mustGet(t, s, key); !got.Hold {
		t.Fatalf("record after a held claim: %+v; want Hold stored", got)
	}
	ref := store.ClaimRef{Key: key, Fence: first.Record.Fence, Owner: "owner-a", Now: now + 1}
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: ref, LeaseUntil: now + 2*lease, Ref: "exec-1"}); err != nil {
		t.Fatalf("Extend of a held claim: %v", err)
	}
	held := mustGet(t, s, key)
	if !held.Hold || held.LeaseUntil != now+2*lease || held.Ref != "exec-1" {
		t.Fatalf("held record after Extend: %+v; want Hold kept, lease %d, ref exec-1", held, now+2*lease)
	}
	past := held.LeaseUntil
	for _, c := range []struct {
		name string
		p    store.ClaimParams
	}{
		{"another owner, past the lease", store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: "owner-b", Now: past, LeaseUntil: past + lease, ExpiresAt: past + expiry}},
		{"another owner with Hold, past the lease", store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: "owner-b", Now: past + 1, LeaseUntil: past + lease, ExpiresAt: past + expiry, Hold: true}},
		{"just before the expiry", store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: "owner-b", Now: held.ExpiresAt - 1, LeaseUntil: held.ExpiresAt + lease, ExpiresAt: held.ExpiresAt + expiry}},
	} {
		res, err := s.Claim(ctx, c.p)
		if err != nil {
			t.Fatalf("claim of a held record, %s: %v", c.name, err)
		}
		if res.Acquired || res.Takeover || res.Record == nil || res.Record.Owner != "owner-a" || !res.Record.Hold {
			t.Fatalf("claim of a held record, %s: acquired %v takeover %v record %+v; want a conflict with owner-a's held claim", c.name, res.Acquired, res.Takeover, res.Record)
		}
		sameRecord(t, "held record after a claim "+c.name, mustGet(t, s, key), held)
		if bc, ok := s.(store.BatchClaimer); ok {
			rs, errs := bc.ClaimBatch(ctx, []store.ClaimParams{c.p})
			if len(rs) != 1 || len(errs) != 1 || errs[0] != nil || rs[0].Acquired || rs[0].Record == nil || rs[0].Record.Owner != "owner-a" {
				t.Fatalf("ClaimBatch of a held record, %s: %+v %v; want a conflict with owner-a's claim", c.name, rs, errs)
			}
			sameRecord(t, "held record after a ClaimBatch "+c.name, mustGet(t, s, key), held)
		}
	}
	if lister, ok := s.(store.Lister); ok {
		found := false
		p := store.ListParams{Status: store.StatusInProgress, Stuck: true, Now: past, Limit: 100}
		for range 10_000 {
			page, err := lister.List(ctx, p)
			if err != nil {
				t.Fatalf("List stuck: %v", err)
			}
			for _, r := range page.Records {
				if r.Key == key {
					found = true
					if !r.Hold {
						t.Errorf("listed held record %+v without Hold", r)
					}
				}
			}
			if page.Next == "" {
				break
			}
			p.Cursor = page.Next
		}
		if !found {
			t.Errorf("the held record past its lease is not listed as stuck")
		}
	}

	// The holder's write lands after its lease; Hold stays with the record.
	ref.Now = past + 5
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: ref, ExpiresAt: past + expiry, Result: []byte("r")}); err != nil {
		t.Fatalf("holder's Complete past its held lease: %v", err)
	}
	if got := mustGet(t, s, key); got.Status != store.StatusCompleted || !got.Hold {
		t.Fatalf("held record after Complete: %+v; want COMPLETED with Hold kept", got)
	}

	// Past its expiry a held record is claimed as any expired record.
	key2 := newKey(t)
	h2 := heldClaim(key2, "owner-a", now).Record
	res, err := s.Claim(ctx, store.ClaimParams{Key: key2, Fingerprint: fp("a"), Owner: "owner-c", Now: h2.ExpiresAt, LeaseUntil: h2.ExpiresAt + lease, ExpiresAt: h2.ExpiresAt + expiry})
	if err != nil || !res.Acquired || res.Takeover || res.Record.Fence != h2.Fence+1 || res.Record.Hold {
		t.Fatalf("claim of a held record at its expiry: %+v, %v; want acquired (not a takeover) with fence %d and no Hold", res, err, h2.Fence+1)
	}
	if got := mustGet(t, s, key2); got.Hold || got.Owner != "owner-c" {
		t.Fatalf("record after the claim at expiry: %+v; want owner-c's claim without Hold", got)
	}
}

// TestClaimBatch: a store that claims in batches ([store.BatchClaimer])
// answers every claim of a batch exactly as Claim would, in order: a new
// key, a live key of another owner (conflict, with its record), an
// expired record (fence + 1), a lease passed (takeover), the same owner's
// retry, and a key named twice — the second claim sees the first. Skipped
// for stores without batch claims.
func TestClaimBatch(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	bc, ok := s.(store.BatchClaimer)
	if !ok {
		t.Skip("store does not claim in batches")
	}
	ctx := context.Background()
	now := base()
	fresh, live, expired, lapsed, retried, twice := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	liveRec := claimAt(t, s, live, "owner-a", fp("a"), now).Record
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: live, Fence: 1, Owner: "owner-a", Now: now}, ExpiresAt: now + expiry, Result: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, store.ClaimParams{Key: expired, Fingerprint: fp("a"), Owner: "owner-a", Now: now - 2*expiry, LeaseUntil: now - 2*expiry + lease, ExpiresAt: now - expiry})
	if err != nil || !res.Acquired {
		t.Fatalf("claim to expire: %+v %v", res, err)
	}
	lapsedRec := claimAt(t, s, lapsed, "owner-a", fp("a"), now-2*lease).Record
	retriedRec := claimAt(t, s, retried, "owner-b", fp("a"), now).Record
	p := func(key, owner string) store.ClaimParams {
		return store.ClaimParams{Key: key, Fingerprint: fp("a"), Owner: owner, Now: now, LeaseUntil: now + lease, ExpiresAt: now + expiry, Local: true}
	}
	got, errs := bc.ClaimBatch(ctx, []store.ClaimParams{
		p(fresh, "owner-b"), p(live, "owner-b"), p(expired, "owner-b"), p(lapsed, "owner-b"), p(retried, "owner-b"), p(twice, "owner-b"), p(twice, "owner-c"),
	})
	if len(got) != 7 || len(errs) != 7 {
		t.Fatalf("ClaimBatch of 7 answered %d results and %d errors", len(got), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d of the batch: %v", i, err)
		}
	}
	want := func(i int, what string, acquired, takeover bool, fence uint64, owner string) {
		t.Helper()
		r := got[i]
		if r.Record == nil {
			t.Fatalf("%s: no record", what)
		}
		if r.Acquired != acquired || r.Takeover != takeover || r.Record.Fence != fence || r.Record.Owner != owner {
			t.Errorf("%s: Acquired=%v Takeover=%v fence %d owner %s; want %v %v %d %s",
				what, r.Acquired, r.Takeover, r.Record.Fence, r.Record.Owner, acquired, takeover, fence, owner)
		}
	}
	want(0, "new key", true, false, 1, "owner-b")
	want(1, "completed key", false, false, liveRec.Fence, "owner-a")
	if got[1].Record.Status != store.StatusCompleted || string(got[1].Record.Result) != "done" {
		t.Errorf("conflict on a completed key: %+v, want the COMPLETED record with its result", got[1].Record)
	}
	want(2, "expired record", true, false, 2, "owner-b")
	want(3, "lease passed", true, true, lapsedRec.Fence+1, "owner-b")
	want(4, "same owner's retry", true, false, retriedRec.Fence, "owner-b")
	want(5, "first of a key named twice", true, false, 1, "owner-b")
	want(6, "second of a key named twice", false, false, 1, "owner-b")
	for i, key := range []string{fresh, expired, lapsed, twice} {
		if r := mustGet(t, s, key); r.Owner != "owner-b" || r.Status != store.StatusInProgress || r.LeaseUntil != now+lease {
			t.Errorf("record %d after the batch: %+v, want IN_PROGRESS held by owner-b", i, r)
		}
	}
	if got, errs := bc.ClaimBatch(ctx, nil); len(got) != 0 || len(errs) != 0 {
		t.Errorf("empty batch: %d results, %d errors", len(got), len(errs))
	}
}

// TestCompleteBatch: a store that completes in batches
// ([store.BatchCompleter]) makes every Complete of a batch exactly as
// Complete would, each under its own condition: two held claims complete;
// a write whose fence another claim took over, one whose owner differs
// and one for a key with no record are refused (ErrFenced, ErrNotFound)
// and change nothing, without stopping the writes after them; a key named
// twice is completed by the first and the second sees it (refused, its
// own claim settled); a result over the store's limit is refused alone.
// Skipped for stores without batch completes.
func TestCompleteBatch(t *testing.T, f Features, newStore NewStore) {
	s := newStore(t)
	bc, ok := s.(store.BatchCompleter)
	if !ok {
		t.Skip("store does not complete in batches")
	}
	ctx := context.Background()
	now := base()
	a, b, taken, other, missing, twice, big := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	for _, k := range []string{a, b, other, twice, big} {
		claimAt(t, s, k, "owner-a", fp("x"), now)
	}
	claimAt(t, s, taken, "owner-a", fp("x"), now-2*lease)
	takenBy := claimAt(t, s, taken, "owner-b", fp("x"), now).Record // fence 2
	c := func(key, owner string, fence uint64, result string) store.CompleteParams {
		return store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: fence, Owner: owner, Now: now + 1}, ExpiresAt: now + expiry, Result: []byte(result)}
	}
	ps := []store.CompleteParams{
		c(a, "owner-a", 1, "ra"),
		c(taken, "owner-a", 1, "stale"),
		c(b, "owner-a", 1, "rb"),
		c(other, "owner-z", 1, "wrong owner"),
		c(missing, "owner-a", 1, "none"),
		c(twice, "owner-a", 1, "first"),
		c(twice, "owner-a", 1, "second"),
	}
	if f.MaxResultBytes > 0 {
		ps = append(ps, store.CompleteParams{ClaimRef: store.ClaimRef{Key: big, Fence: 1, Owner: "owner-a", Now: now + 1}, ExpiresAt: now + expiry, Result: make([]byte, f.MaxResultBytes+1)})
	}
	errs := bc.CompleteBatch(ctx, ps)
	if len(errs) != len(ps) {
		t.Fatalf("CompleteBatch of %d answered %d errors", len(ps), len(errs))
	}
	for i, k := range []string{a, b} {
		if errs[2*i] != nil {
			t.Errorf("complete of held claim %s: %v", k, errs[2*i])
		}
	}
	for _, r := range []struct {
		i    int
		what string
		want error
	}{{1, "fence taken over", store.ErrFenced}, {3, "another owner", store.ErrFenced}, {4, "no record", store.ErrNotFound}, {6, "second of a key named twice", store.ErrFenced}} {
		if !errors.Is(errs[r.i], r.want) {
			t.Errorf("%s: %v, want %v", r.what, errs[r.i], r.want)
		}
	}
	if errs[5] != nil {
		t.Errorf("first of a key named twice: %v", errs[5])
	}
	if f.MaxResultBytes > 0 && !errors.Is(errs[7], store.ErrTooLarge) {
		t.Errorf("a result over the limit: %v, want ErrTooLarge", errs[7])
	}
	for key, want := range map[string]string{a: "ra", b: "rb", twice: "first"} {
		if r := mustGet(t, s, key); r.Status != store.StatusCompleted || string(r.Result) != want {
			t.Errorf("%s after the batch: %s %q, want COMPLETED %q", key, r.Status, r.Result, want)
		}
	}
	if r := mustGet(t, s, taken); r.Status != store.StatusInProgress || r.Fence != takenBy.Fence || r.Owner != "owner-b" {
		t.Errorf("the taken-over key after a stale complete: %+v, want IN_PROGRESS held by owner-b", r)
	}
	if r := mustGet(t, s, other); r.Status != store.StatusInProgress || r.Owner != "owner-a" {
		t.Errorf("the key completed by another owner: %+v, want IN_PROGRESS held by owner-a", r)
	}
	if _, err := s.Get(ctx, missing); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the key with no record: %v, want ErrNotFound", err)
	}
	if f.MaxResultBytes > 0 {
		if r := mustGet(t, s, big); r.Status != store.StatusInProgress {
			t.Errorf("the key whose result was too large: %s, want IN_PROGRESS", r.Status)
		}
	}
	if errs := bc.CompleteBatch(ctx, nil); len(errs) != 0 {
		t.Errorf("empty batch: %d errors", len(errs))
	}
}

// TestExtendBatch: a store that renews leases in batches
// ([store.BatchExtender]) makes every Extend of a batch exactly as Extend
// would, each under its own condition and with its own lease: two held
// claims are renewed, each to its own LeaseUntil; a renewal whose fence
// another claim took over, one whose owner differs, one for a settled
// record and one for a key with no record are refused (ErrFenced,
// ErrNotFound) and change nothing, without stopping the renewals after
// them; an Extend with a settled From is refused with ErrInvalidParams
// alone. Skipped for stores without batch renewals.
func TestExtendBatch(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	be, ok := s.(store.BatchExtender)
	if !ok {
		t.Skip("store does not renew leases in batches")
	}
	ctx := context.Background()
	now := base()
	a, b, taken, other, done, missing, from := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	for _, k := range []string{a, b, other, done, from} {
		claimAt(t, s, k, "owner-a", fp("x"), now)
	}
	claimAt(t, s, taken, "owner-a", fp("x"), now-2*lease)
	takenBy := claimAt(t, s, taken, "owner-b", fp("x"), now).Record // fence 2
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: done, Fence: 1, Owner: "owner-a", Now: now}, ExpiresAt: now + expiry, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	before := map[string]*store.Record{}
	for _, k := range []string{taken, other, done, from} {
		before[k] = mustGet(t, s, k)
	}
	x := func(key, owner string, fence uint64, until int64) store.ExtendParams {
		return store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: fence, Owner: owner, Now: now + 1}, LeaseUntil: until}
	}
	bad := x(from, "owner-a", 1, now+9*lease)
	bad.From = store.StatusCompleted
	ps := []store.ExtendParams{
		x(a, "owner-a", 1, now+3*lease),
		x(taken, "owner-a", 1, now+9*lease),
		x(b, "owner-a", 1, now+4*lease),
		x(other, "owner-z", 1, now+9*lease),
		x(done, "owner-a", 1, now+9*lease),
		x(missing, "owner-a", 1, now+9*lease),
		bad,
	}
	errs := be.ExtendBatch(ctx, ps)
	if len(errs) != len(ps) {
		t.Fatalf("ExtendBatch of %d answered %d errors", len(ps), len(errs))
	}
	for _, r := range []struct {
		i    int
		what string
		want error
	}{{1, "fence taken over", store.ErrFenced}, {3, "another owner", store.ErrFenced}, {4, "a settled record", store.ErrFenced}, {5, "no record", store.ErrNotFound}, {6, "a settled From", store.ErrInvalidParams}} {
		if !errors.Is(errs[r.i], r.want) {
			t.Errorf("%s: %v, want %v", r.what, errs[r.i], r.want)
		}
	}
	var fe *store.FencedError
	if !errors.As(errs[1], &fe) || fe.Current != takenBy.Fence || fe.CurrentOwner != "owner-b" {
		t.Errorf("the taken-over key's refusal %v does not name the new claim (fence %d, owner-b)", errs[1], takenBy.Fence)
	}
	for i, k := range []string{a, b} {
		if errs[2*i] != nil {
			t.Errorf("renewal of held claim %s: %v", k, errs[2*i])
		}
		if r := mustGet(t, s, k); r.Status != store.StatusInProgress || r.LeaseUntil != ps[2*i].LeaseUntil {
			t.Errorf("%s after the batch: %s lease %d, want IN_PROGRESS lease %d", k, r.Status, r.LeaseUntil, ps[2*i].LeaseUntil)
		}
	}
	for k, r := range before {
		sameRecord(t, "a refused renewal changed "+k, mustGet(t, s, k), r)
	}
	if _, err := s.Get(ctx, missing); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the key with no record: %v, want ErrNotFound", err)
	}
	if res := claimAt(t, s, a, "owner-c", fp("x"), now+2*lease); res.Acquired {
		t.Error("a claim after the old lease took over a claim the batch renewed")
	}
	if errs := be.ExtendBatch(ctx, nil); len(errs) != 0 {
		t.Errorf("empty batch: %d errors", len(errs))
	}
}

// TestClaimBatchMatchesClaim: claims made by ClaimBatch answer and write
// exactly what the same claims made one by one by Claim do in memstore, the
// reference, over the same history: live, completed, lease-passed and
// expired records, and keys named more than once (conflicts, takeovers
// and retries within the batch). Skipped for stores without batch claims.
func TestClaimBatchMatchesClaim(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	bc, ok := s.(store.BatchClaimer)
	if !ok {
		t.Skip("store does not claim in batches")
	}
	ref := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = ref.Close() })
	ctx := context.Background()
	now := base()
	key := map[string]string{}
	for _, name := range []string{"new", "live", "done", "lapsed", "gone", "other"} {
		key[name] = newKey(t)
	}
	claim := func(name, owner string, at int64) store.ClaimParams {
		return store.ClaimParams{Key: key[name], Owner: owner, Fingerprint: fp("a"), Now: at, LeaseUntil: at + 1000, ExpiresAt: at + 10_000}
	}
	// The same history in both stores.
	for _, st := range []store.Store{s, ref} {
		for _, name := range []string{"live", "done", "lapsed", "gone"} {
			if _, err := st.Claim(ctx, claim(name, "before", now-5000)); err != nil {
				t.Fatal(err)
			}
		}
		// live: renewed past now; lapsed: lease passed at now-4000;
		// done: completed; gone: completed and expired at now.
		if err := st.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key["live"], Fence: 1, Owner: "before", Now: now - 5000}, LeaseUntil: now + 3000}); err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key["done"], Fence: 1, Owner: "before", Now: now - 5000}, ExpiresAt: now + 9000, Result: []byte("r")}); err != nil {
			t.Fatal(err)
		}
		if err := st.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key["gone"], Fence: 1, Owner: "before", Now: now - 5000}, ExpiresAt: now, Result: []byte("r")}); err != nil {
			t.Fatal(err)
		}
	}
	ps := []store.ClaimParams{
		claim("new", "a", now), claim("new", "b", now), claim("new", "a", now), // conflict, then a's retry
		claim("live", "a", now), claim("done", "a", now),
		claim("lapsed", "a", now), claim("lapsed", "b", now), // takeover, then a conflict with it
		claim("gone", "a", now), claim("gone", "a", now), // re-claim after expiry, then a's retry
		claim("other", "a", now),
	}
	res, errs := bc.ClaimBatch(ctx, ps)
	if len(res) != len(ps) || len(errs) != len(ps) {
		t.Fatalf("ClaimBatch of %d answered %d results and %d errors", len(ps), len(res), len(errs))
	}
	for i, p := range ps {
		want, err := ref.Claim(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if errs[i] != nil {
			t.Errorf("claim %d by %s: %v", i, p.Owner, errs[i])
			continue
		}
		got := res[i]
		if got.Record == nil {
			t.Errorf("claim %d by %s: no record", i, p.Owner)
			continue
		}
		if got.Acquired != want.Acquired || got.Takeover != want.Takeover || got.Record.Fence != want.Record.Fence ||
			got.Record.Owner != want.Record.Owner || got.Record.Status != want.Record.Status || !bytes.Equal(got.Record.Result, want.Record.Result) {
			t.Errorf("claim %d by %s: acquired %v takeover %v fence %d owner %s status %v; want %v %v %d %s %v", i, p.Owner,
				got.Acquired, got.Takeover, got.Record.Fence, got.Record.Owner, got.Record.Status,
				want.Acquired, want.Takeover, want.Record.Fence, want.Record.Owner, want.Record.Status)
		}
	}
	// What the batch wrote is what Claim would have written.
	for _, name := range []string{"new", "lapsed", "gone", "other"} {
		want, err := ref.Get(ctx, key[name])
		if err != nil {
			t.Fatal(err)
		}
		sameRecord(t, "record "+name+" after the batch", mustGet(t, s, key[name]), want)
	}
}

// TestBatchOwnParams: every claim and every Complete of a batch is made
// with its own parameters — its own now, lease, expiry, owner and
// fingerprint; its own result and expiry — and writes what the same call
// made alone writes (in memstore, the reference), however they differ from
// the batch's other items. Skipped for a store without batch claims or
// completes.
func TestBatchOwnParams(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	bc, claims := s.(store.BatchClaimer)
	bp, completes := s.(store.BatchCompleter)
	if !claims && !completes {
		t.Skip("store neither claims nor completes in batches")
	}
	ref := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = ref.Close() })
	ctx := context.Background()
	now := base()
	keys := make([]string, 4)
	ps := make([]store.ClaimParams, len(keys))
	for i := range keys {
		keys[i] = newKey(t)
		at := now + int64(i)*1000 // each its own now, lease and expiry
		ps[i] = store.ClaimParams{Key: keys[i], Owner: fmt.Sprintf("owner-%d", i), Fingerprint: fp(fmt.Sprint("payload ", i)),
			Now: at, LeaseUntil: at + lease + int64(i)*777, ExpiresAt: at + expiry - int64(i)*999}
	}
	for i, p := range ps {
		if _, err := ref.Claim(ctx, p); err != nil {
			t.Fatal(err)
		}
		if claims {
			continue
		}
		if res, err := s.Claim(ctx, p); err != nil || !res.Acquired {
			t.Fatalf("claim %d: %+v, %v", i, res, err)
		}
	}
	if claims {
		res, errs := bc.ClaimBatch(ctx, ps)
		for i := range ps {
			if errs[i] != nil || !res[i].Acquired {
				t.Fatalf("claim %d of the batch: %+v, %v", i, res[i], errs[i])
			}
			want := mustGet(t, ref, keys[i])
			sameRecord(t, fmt.Sprintf("claim %d's answer", i), res[i].Record, want)
			sameRecord(t, fmt.Sprintf("record %d after the batch claim", i), mustGet(t, s, keys[i]), want)
		}
	}
	if !completes {
		return
	}
	cs := make([]store.CompleteParams, len(ps))
	for i, p := range ps {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: p.Owner, Now: p.Now + 5 + int64(i)},
			ExpiresAt: p.Now + 2*expiry + int64(i)*333, Result: []byte(fmt.Sprintf("result %d", i))}
		if err := ref.Complete(ctx, cs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range bp.CompleteBatch(ctx, cs) {
		if err != nil {
			t.Fatalf("complete %d of the batch: %v", i, err)
		}
		sameRecord(t, fmt.Sprintf("record %d after the batch complete", i), mustGet(t, s, keys[i]), mustGet(t, ref, keys[i]))
	}
}

// TestBatchStorm: batch claims racing each other and single claims over
// the same fresh keys, each batch naming them in its own order (so a store
// that locks the rows of a batch must not deadlock): every key is acquired
// by exactly one claim, and every other claim of it answers a conflict
// with the winner's record. Skipped for stores without batch claims.
func TestBatchStorm(t *testing.T, f Features, newStore NewStore) {
	f = f.withDefaults()
	s := newStore(t)
	bc, ok := s.(store.BatchClaimer)
	if !ok {
		t.Skip("store does not claim in batches")
	}
	ctx := context.Background()
	now := base()
	const nkeys = 8
	for round := range 5 {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = newKey(t)
		}
		p := func(key, owner string) store.ClaimParams {
			return store.ClaimParams{Key: key, Owner: owner, Fingerprint: fp("a"), Now: now, LeaseUntil: now + lease, ExpiresAt: now + expiry}
		}
		var mu sync.Mutex
		winners := map[string][]string{}
		seen := map[string][]string{} // the holders the losers were told of
		answer := func(key, owner string, res store.ClaimResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("round %d: claim of %s by %s: %v", round, key, owner, err)
			case res.Record == nil:
				t.Errorf("round %d: claim of %s by %s: no record", round, key, owner)
			case res.Acquired:
				winners[key] = append(winners[key], owner)
			default:
				seen[key] = append(seen[key], res.Record.Owner)
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range max(f.StormGoroutines/8, 4) {
			owner := fmt.Sprintf("batch-%d", g)
			wg.Go(func() {
				ps := make([]store.ClaimParams, nkeys)
				for i := range ps {
					ps[i] = p(keys[(i*(2*g+1)+g)%nkeys], owner) // a permutation of its own (2g+1 is prime to nkeys)
				}
				<-start
				res, errs := bc.ClaimBatch(ctx, ps)
				if len(res) != len(ps) || len(errs) != len(ps) {
					t.Errorf("ClaimBatch of %d answered %d results and %d errors", len(ps), len(res), len(errs))
					return
				}
				for i, q := range ps {
					answer(q.Key, owner, res[i], errs[i])
				}
			})
			single := fmt.Sprintf("single-%d", g)
			wg.Go(func() {
				<-start
				key := keys[g%nkeys]
				res, err := s.Claim(ctx, p(key, single))
				answer(key, single, res, err)
			})
		}
		close(start)
		wg.Wait()
		for _, key := range keys {
			w := winners[key]
			if len(w) != 1 {
				t.Fatalf("round %d: key acquired by %v, want exactly one claim", round, w)
			}
			for _, o := range seen[key] {
				if o != w[0] {
					t.Fatalf("round %d: a conflict answered holder %s, but %s acquired the key", round, o, w[0])
				}
			}
		}
	}
}

// TestFencing: after a takeover, every write of the old holder —
// Complete, Fail, Release, Extend — is refused with ErrFenced and changes
// nothing; so are writes to a record no longer IN_PROGRESS.
func TestFencing(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	old := claimAt(t, s, key, "zombie", fp("a"), now).Record
	cur := claimAt(t, s, key, "owner-b", fp("a"), old.LeaseUntil).Record
	at := old.LeaseUntil + 1
	before := mustGet(t, s, key)
	sameRecord(t, "record after takeover", before, cur)
	writes := map[string]func(fence uint64, owner string) error{
		"Complete": func(f uint64, o string) error {
			return s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: f, Owner: o, Now: at}, ExpiresAt: at + expiry, Result: []byte("zombie")})
		},
		"Fail": func(f uint64, o string) error {
			return s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: f, Owner: o, Now: at}, ExpiresAt: at + expiry, Err: store.ErrorRecord{Code: "zombie"}})
		},
		"Release": func(f uint64, o string) error {
			return s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: f, Owner: o, Now: at}})
		},
		"Extend": func(f uint64, o string) error {
			return s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: f, Owner: o, Now: at}, LeaseUntil: at + 10*lease})
		},
		"Attach": func(f uint64, o string) error {
			return s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: f, Owner: o, Now: at}, Ref: "zombie-execution"})
		},
	}
	stale := []struct {
		what  string
		fence uint64
		owner string
	}{
		{"the zombie's claim", old.Fence, old.Owner},
		{"a fence ahead of the record's", cur.Fence + 1, cur.Owner},
		{"the record's fence under another owner", cur.Fence, old.Owner},
	}
	for name, w := range writes {
		for _, c := range stale {
			err := w(c.fence, c.owner)
			var fe *store.FencedError
			if !errors.Is(err, store.ErrFenced) || !errors.As(err, &fe) {
				t.Errorf("%s with %s (fence %d, owner %s): %v, want a *FencedError", name, c.what, c.fence, c.owner, err)
			} else if fe.Current != cur.Fence || fe.CurrentOwner != cur.Owner || fe.Own() {
				t.Errorf("%s with %s: FencedError names claim %d (%s), want the record's %d (%s)",
					name, c.what, fe.Current, fe.CurrentOwner, cur.Fence, cur.Owner)
			}
		}
		sameRecord(t, name+" by a zombie changed the record", mustGet(t, s, key), before)
	}
	// Completed records refuse every fenced write, even with their claim,
	// and say that the claim is the writer's own: how a Complete retried
	// after its reply was lost learns that the first attempt landed.
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: cur.Fence, Owner: cur.Owner, Now: at}, ExpiresAt: at + expiry, Result: []byte("ok")}); err != nil {
		t.Fatalf("Complete by the holder: %v", err)
	}
	done := mustGet(t, s, key)
	for name, w := range writes {
		err := w(cur.Fence, cur.Owner)
		var fe *store.FencedError
		if !errors.As(err, &fe) {
			t.Errorf("%s of a COMPLETED record: %v, want a *FencedError", name, err)
		} else if !fe.Own() || fe.Status != store.StatusCompleted {
			t.Errorf("%s of its own COMPLETED record: FencedError %+v, want Own() and status COMPLETED", name, fe)
		}
		sameRecord(t, name+" changed a COMPLETED record", mustGet(t, s, key), done)
	}
}

// TestReclaimAfterDeletion: a record that vanished — deleted by a TTL or
// a sweeper after it expired, or released — and was claimed afresh may
// start again at the same fence, but it is another claim: every write of
// the first holder (Complete, Fail, Release, Extend) is refused and the
// new record is unchanged. Without this, a holder that outlived its claim
// deletes the next holder's live claim (a third caller then runs
// concurrently) or stamps it with its own stale outcome. The TTL variant
// runs on stores with the store.Deleter power.
func TestReclaimAfterDeletion(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	check := func(t *testing.T, key string, first *store.Record, at int64) {
		t.Helper()
		before := mustGet(t, s, key)
		writes := map[string]error{
			"Complete": s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: at}, ExpiresAt: at + expiry, Result: []byte("stale")}),
			"Fail":     s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: at}, ExpiresAt: at + expiry, Err: store.ErrorRecord{Code: "stale"}}),
			"Extend":   s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: at}, LeaseUntil: at + 10*lease}),
			"Attach":   s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: at}, Ref: "stale-execution"}),
			"Release":  s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: at}}),
		}
		for name, err := range writes {
			if !errors.Is(err, store.ErrFenced) {
				t.Errorf("%s by the first holder (fence %d) into the new claim (fence %d): %v, want ErrFenced",
					name, first.Fence, before.Fence, err)
			}
		}
		sameRecord(t, "new claim after the first holder's writes", mustGet(t, s, key), before)
	}
	t.Run("Released", func(t *testing.T) {
		key, now := newKey(t), base()
		first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: first.Fence, Owner: first.Owner, Now: now + 1}}); err != nil {
			t.Fatal(err)
		}
		second := claimAt(t, s, key, "owner-b", fp("a"), now+2)
		if !second.Acquired {
			t.Fatal("claim after Release did not acquire")
		}
		check(t, key, first, now+3) // the first holder's writes retried after a lost reply
	})
	t.Run("DeletedByTTL", func(t *testing.T) {
		deleter, ok := s.(store.Deleter)
		if !ok {
			t.Skip("store does not implement store.Deleter")
		}
		key, now := newKey(t), base()
		first := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		at := first.ExpiresAt
		if err := deleter.Delete(ctx, key); err != nil { // as a TTL would, once expired
			t.Fatal(err)
		}
		second := claimAt(t, s, key, "owner-b", fp("a"), at)
		if !second.Acquired || second.Record.Fence != 1 {
			t.Fatalf("claim after deletion: Acquired=%v fence %d, want a fresh claim with fence 1", second.Acquired, second.Record.Fence)
		}
		check(t, key, first, at+1) // the first holder still runs, and ends
	})
}

// TestExtend: Extend moves the lease, so a takeover must wait for the new
// LeaseUntil.
func TestExtend(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	newLease := rec.LeaseUntil + 5*lease
	if err := s.Extend(context.Background(), store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 100}, LeaseUntil: newLease}); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if got := mustGet(t, s, key).LeaseUntil; got != newLease {
		t.Fatalf("LeaseUntil after Extend = %d, want %d", got, newLease)
	}
	if res := claimAt(t, s, key, "owner-b", fp("a"), rec.LeaseUntil); res.Acquired {
		t.Fatal("claim at the old lease end took over an extended claim")
	}
	if res := claimAt(t, s, key, "owner-b", fp("a"), newLease); !res.Acquired || !res.Takeover {
		t.Fatalf("claim at the new lease end: Acquired=%v Takeover=%v", res.Acquired, res.Takeover)
	}
}

// TestAttach: Extend with a Ref attaches an execution reference to the
// claim and, with no LeaseUntil, leaves the lease as it was; with both it
// does both in one step. The reference is read back by Get, by a
// conflicting Claim and after the record settles.
func TestAttach(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	const ref = "arn:aws:states:us-east-1:123456789012:execution:transfers:t-0f3a"
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}, Ref: ref}); err != nil {
		t.Fatalf("Extend with a Ref only: %v", err)
	}
	want := *rec
	want.Ref = ref
	sameRecord(t, "Get after attaching", mustGet(t, s, key), &want)
	if res := claimAt(t, s, key, "owner-b", fp("a"), now+2); res.Acquired {
		t.Fatal("claim of an attached live key acquired it")
	} else {
		sameRecord(t, "conflict record of an attached key", res.Record, &want)
	}
	// Both at once: a new lease and another reference (a redrive, an
	// adopted execution).
	want.LeaseUntil, want.Ref = now+20*lease, ref+"-2"
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 3}, LeaseUntil: want.LeaseUntil, Ref: want.Ref}); err != nil {
		t.Fatalf("Extend with a lease and a Ref: %v", err)
	}
	sameRecord(t, "Get after extending and attaching", mustGet(t, s, key), &want)
	// Neither: a check that the claim is still held, which changes nothing.
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 4}}); err != nil {
		t.Fatalf("Extend with neither: %v", err)
	}
	sameRecord(t, "Get after an empty Extend", mustGet(t, s, key), &want)
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 5}, ExpiresAt: now + 5 + expiry, Result: []byte("done")}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want.Status, want.Result, want.CompletedAt, want.ExpiresAt = store.StatusCompleted, []byte("done"), now+5, now+5+expiry
	sameRecord(t, "COMPLETED record keeps its reference", mustGet(t, s, key), &want)
}

// TestExtendFrom: Extend changes IN_PROGRESS records only, so a From that
// names another status is a caller's mistake: refused with
// [store.ErrInvalidParams] before the record is looked at, in progress or
// settled, and nothing changes. From spelled out as IN_PROGRESS is the same
// as zero.
func TestExtendFrom(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	ref := store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}
	refused := func(what string, from store.Status) {
		t.Helper()
		before := mustGet(t, s, key)
		r := ref
		r.From = from
		if err := s.Extend(ctx, store.ExtendParams{ClaimRef: r, LeaseUntil: now + 10*lease, Ref: "x"}); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: Extend From %v: %v, want ErrInvalidParams", what, from, err)
		}
		sameRecord(t, what+": a refused Extend changed the record", mustGet(t, s, key), before)
	}
	refused("IN_PROGRESS record", store.StatusCompleted)
	refused("IN_PROGRESS record", store.StatusFailed)

	r := ref
	r.From = store.StatusInProgress
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: r, LeaseUntil: now + 5*lease}); err != nil {
		t.Fatalf("Extend From IN_PROGRESS: %v", err)
	}
	if got := mustGet(t, s, key).LeaseUntil; got != now+5*lease {
		t.Fatalf("LeaseUntil after Extend From IN_PROGRESS = %d, want %d", got, now+5*lease)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: ref, ExpiresAt: now + expiry, Result: []byte("done")}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	refused("COMPLETED record", store.StatusCompleted)
}

// TestResettle: a settled record can be corrected by a fenced write that
// names the status it must be in (From): the claim that settled it turns
// FAILED into COMPLETED (a workflow redriven to success), COMPLETED into
// FAILED, or releases it so the key runs again. The write is refused, and
// changes nothing, when the record is in another status or holds another
// claim, exactly as fenced writes of an IN_PROGRESS record are.
func TestResettle(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	key, now := newKey(t), base()
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, Ref: "execution-1"}); err != nil {
		t.Fatal(err)
	}
	er := store.ErrorRecord{Code: "States.Timeout", Message: "execution timed out"}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 1}, ExpiresAt: now + 1 + expiry, Err: er}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	failed := mustGet(t, s, key)
	refused := func(what string, err error, status store.Status, before *store.Record) {
		t.Helper()
		var fe *store.FencedError
		if !errors.As(err, &fe) || fe.Status != status {
			t.Errorf("%s: %v, want a *FencedError naming status %v", what, err, status)
		}
		sameRecord(t, what+" changed the record", mustGet(t, s, key), before)
	}
	// A settled record refuses writes that expect IN_PROGRESS, and writes
	// from another claim whatever they expect.
	refused("Complete of a FAILED record without From", s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now + 2}, ExpiresAt: now + 2 + expiry, Result: []byte("x")}), store.StatusFailed, failed)
	refused("Complete From FAILED by another owner", s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: "owner-b", From: store.StatusFailed, Now: now + 2}, ExpiresAt: now + 2 + expiry, Result: []byte("x")}), store.StatusFailed, failed)
	refused("Release From COMPLETED of a FAILED record", s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, From: store.StatusCompleted, Now: now + 2}}), store.StatusFailed, failed)

	// FAILED → COMPLETED: the error goes, the result and times are new,
	// the claim and its reference stay.
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, From: store.StatusFailed, Now: now + 3}, ExpiresAt: now + 3 + expiry, Result: []byte("redriven")}); err != nil {
		t.Fatalf("Complete From FAILED: %v", err)
	}
	want := *failed
	want.Status, want.Err, want.Result, want.CompletedAt, want.ExpiresAt = store.StatusCompleted, nil, []byte("redriven"), now+3, now+3+expiry
	sameRecord(t, "Get after Complete From FAILED", mustGet(t, s, key), &want)
	// The same write again (its reply lost) finds the record settled as
	// it wanted, under its own claim.
	err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, From: store.StatusFailed, Now: now + 4}, ExpiresAt: now + 4 + expiry, Result: []byte("redriven")})
	var fe *store.FencedError
	if !errors.As(err, &fe) || !fe.Own() || fe.Status != store.StatusCompleted {
		t.Errorf("Complete From FAILED retried after it landed: %v, want a *FencedError that is Own() with status COMPLETED", err)
	}

	// COMPLETED → FAILED: the result goes.
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, From: store.StatusCompleted, Now: now + 5}, ExpiresAt: now + 5 + expiry, Err: er}); err != nil {
		t.Fatalf("Fail From COMPLETED: %v", err)
	}
	want.Status, want.Err, want.Result, want.CompletedAt, want.ExpiresAt = store.StatusFailed, &er, nil, now+5, now+5+expiry
	sameRecord(t, "Get after Fail From COMPLETED", mustGet(t, s, key), &want)

	// Release From FAILED: the key is free again.
	if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, From: store.StatusFailed, Now: now + 6}}); err != nil {
		t.Fatalf("Release From FAILED: %v", err)
	}
	if res := claimAt(t, s, key, "owner-b", fp("a"), now+7); !res.Acquired {
		t.Fatal("claim after Release From FAILED did not acquire")
	}

	// An expired settled record is absent to every write.
	key2 := newKey(t)
	rec2 := claimAt(t, s, key2, "owner-a", fp("a"), now).Record
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key2, Fence: rec2.Fence, Owner: rec2.Owner, Now: now}, ExpiresAt: now + 10, Err: er}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key2, Fence: rec2.Fence, Owner: rec2.Owner, From: store.StatusFailed, Now: now + 10}, ExpiresAt: now + 10 + expiry, Result: []byte("late")}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Complete From FAILED of an expired record: %v, want ErrNotFound", err)
	}
}

// TestExpiryBoundary: the one rule every store shares — a record counts as
// absent when now >= ExpiresAt, decided from the timestamps on every
// operation, never from the backend's TTL.
func TestExpiryBoundary(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	now := base()

	// A COMPLETED record replays until ExpiresAt-1 and is re-claimable at
	// ExpiresAt.
	key := newKey(t)
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	exp := now + 50_000
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, ExpiresAt: exp, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if res := claimAt(t, s, key, "owner-b", fp("a"), exp-1); res.Acquired {
		t.Fatal("claim one millisecond before expiry acquired a COMPLETED key")
	}
	res := claimAt(t, s, key, "owner-b", fp("b"), exp)
	if !res.Acquired || res.Takeover {
		t.Fatalf("claim at ExpiresAt: Acquired=%v Takeover=%v, want true false", res.Acquired, res.Takeover)
	}
	if f := res.Record.Fence; f != rec.Fence+1 && f != 1 {
		t.Fatalf("fence after re-claim of an expired record = %d, want %d (or 1 if the backend reclaimed it)", f, rec.Fence+1)
	}
	if res.Record.Status != store.StatusInProgress || res.Record.Fingerprint != fp("b") || len(res.Record.Result) != 0 {
		t.Fatalf("re-claimed record kept old state: %+v", res.Record)
	}

	// Fenced writes to an expired claim say ErrNotFound, even with the
	// right fence, and Get shows it expired (or gone).
	key2 := newKey(t)
	c := claimAt(t, s, key2, "owner-a", fp("a"), now).Record
	at := c.ExpiresAt
	errs := map[string]error{
		"Complete": s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key2, Fence: c.Fence, Owner: c.Owner, Now: at}, ExpiresAt: at + expiry, Result: []byte("late")}),
		"Fail":     s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key2, Fence: c.Fence, Owner: c.Owner, Now: at}, ExpiresAt: at + expiry, Err: store.ErrorRecord{Code: "late"}}),
		"Extend":   s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key2, Fence: c.Fence, Owner: c.Owner, Now: at}, LeaseUntil: at + lease}),
		"Release":  s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key2, Fence: c.Fence, Owner: c.Owner, Now: at}}),
	}
	for name, err := range errs {
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s of an expired claim: %v, want ErrNotFound", name, err)
		}
	}
	if r, err := s.Get(ctx, key2); err == nil {
		if !r.Expired(at) || r.Status != store.StatusInProgress || len(r.Result) != 0 {
			t.Errorf("expired record changed by refused writes: %+v", r)
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of an expired record: %v", err)
	}
}

// TestResultSizeLimit: a result of exactly the store's limit round-trips
// byte for byte; one byte more fails with a *TooLargeError and leaves the
// claim untouched.
func TestResultSizeLimit(t *testing.T, f Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	limit := f.MaxResultBytes
	if limit == 0 {
		limit = 1 << 20
	}
	big := make([]byte, limit)
	for i := range big {
		big[i] = byte(i*7 + i>>8)
	}
	now := base()
	if f.MaxResultBytes > 0 {
		key := newKey(t)
		rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
		err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, ExpiresAt: now + expiry, Result: append(big, 'x')})
		var tl *store.TooLargeError
		if !errors.Is(err, store.ErrTooLarge) || !errors.As(err, &tl) {
			t.Fatalf("Complete one byte over the limit: %v, want *TooLargeError", err)
		}
		sameRecord(t, "record after a refused large Complete", mustGet(t, s, key), rec)
		err = s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, ExpiresAt: now + expiry, Err: store.ErrorRecord{Code: "c", Body: append(big, 'x')}})
		if !errors.Is(err, store.ErrTooLarge) {
			t.Fatalf("Fail with a body over the limit: %v, want ErrTooLarge", err)
		}
		sameRecord(t, "record after a refused large Fail", mustGet(t, s, key), rec)
	}
	key := newKey(t)
	rec := claimAt(t, s, key, "owner-a", fp("a"), now).Record
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, ExpiresAt: now + expiry, Result: big}); err != nil {
		t.Fatalf("Complete with %d bytes (the limit): %v", len(big), err)
	}
	if got := mustGet(t, s, key).Result; !bytes.Equal(got, big) {
		t.Fatalf("result at the limit came back as %d bytes, not the %d stored", len(got), len(big))
	}
	res := claimAt(t, s, key, "owner-b", fp("a"), now+1)
	if res.Acquired || !bytes.Equal(res.Record.Result, big) {
		t.Fatalf("conflict path did not return the full result (%d bytes)", len(res.Record.Result))
	}
}

// engineFor builds an engine over s with a manual clock at base().
func engineFor(t *testing.T, s store.Store, cfg idem.Config) (*idem.Engine, *clocktest.Clock) {
	t.Helper()
	clk := clocktest.New(store.FromMillis(base()))
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = -1
	}
	e, err := idem.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

// TestEngineMismatchEveryPath: a reused key with another payload is a
// mismatch on every path — against a COMPLETED, FAILED and IN_PROGRESS
// record returned by the one-round-trip claim, and from the local cache.
func TestEngineMismatchEveryPath(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	e, _ := engineFor(t, s, idem.Config{CacheEntries: 10_000})
	plain, _ := engineFor(t, s, idem.Config{})
	scope := fmt.Sprintf("mismatch%x", rand.Uint32())
	reqA := func(key string) idem.Request {
		return idem.Request{Operation: scope, Key: key, Payload: []byte(`{"amount":100}`)}
	}
	reqB := func(key string) idem.Request {
		return idem.Request{Operation: scope, Key: key, Payload: []byte(`{"amount":101}`)}
	}
	ok := func(context.Context) (string, error) { return "done", nil }

	// COMPLETED, via the store (plain engine) and via the cache.
	if _, err := idem.Do(ctx, e, reqA("completed"), ok); err != nil {
		t.Fatal(err)
	}
	for name, eng := range map[string]*idem.Engine{"store": plain, "cache": e} {
		_, err := idem.Do(ctx, eng, reqB("completed"), ok)
		if !errors.Is(err, idem.ErrMismatch) {
			t.Errorf("COMPLETED key, other payload (%s path): %v, want ErrMismatch", name, err)
		}
	}
	// FAILED.
	_, err := idem.Do(ctx, e, reqA("failed"), func(context.Context) (string, error) {
		return "", idem.Terminal(errors.New("declined"), "declined")
	})
	if !errors.Is(err, idem.ErrTerminal) {
		t.Fatalf("terminal error: %v", err)
	}
	if _, err := idem.Do(ctx, plain, reqB("failed"), ok); !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("FAILED key, other payload: %v, want ErrMismatch", err)
	}
	// IN_PROGRESS: the check comes before the in-progress answer.
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = idem.Do(ctx, e, reqA("running"), func(context.Context) (string, error) {
			close(started)
			<-release
			return "done", nil
		})
	}()
	<-started
	_, err = idem.Do(ctx, plain, reqB("running"), ok)
	if !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("IN_PROGRESS key, other payload (store path): %v, want ErrMismatch", err)
	}
	_, err = idem.Do(ctx, e, reqB("running"), ok)
	if !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("IN_PROGRESS key, other payload (in-process path): %v, want ErrMismatch", err)
	}
	if _, err := idem.Do(ctx, plain, reqA("running"), ok); !errors.Is(err, idem.ErrInProgress) {
		t.Errorf("IN_PROGRESS key, same payload: %v, want ErrInProgress", err)
	}
	close(release)
	wg.Wait()
}

// TestEngineReplay: through the engine, a second call replays the value
// and a terminal error without running the operation, and a retryable
// error lets the next call run.
func TestEngineReplay(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	ctx := context.Background()
	e, _ := engineFor(t, s, idem.Config{})
	scope := fmt.Sprintf("replay%x", rand.Uint32())
	var runs atomic.Int32
	charge := func(ctx context.Context) (map[string]int, error) {
		runs.Add(1)
		if _, ok := idem.FromContext(ctx); !ok {
			return nil, errors.New("no claim in the operation's context")
		}
		return map[string]int{"charged": 100}, nil
	}
	req := idem.Request{Operation: scope, Key: "k1", Payload: []byte(`{"a":1}`)}
	r1, err := idem.Do(ctx, e, req, charge)
	if err != nil || r1.Replayed || r1.Value["charged"] != 100 {
		t.Fatalf("first call: %+v, %v", r1, err)
	}
	r2, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: "k1", Payload: []byte(` { "a" : 1 } `)}, charge)
	if err != nil || !r2.Replayed || r2.Value["charged"] != 100 {
		t.Fatalf("second call: %+v, %v", r2, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("operation ran %d times, want 1", runs.Load())
	}

	var tries atomic.Int32
	flaky := func(context.Context) (int, error) {
		if tries.Add(1) == 1 {
			return 0, errors.New("timeout talking to the bank")
		}
		return 7, nil
	}
	if _, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: "k2"}, flaky); err == nil {
		t.Fatal("want the retryable error from the first try")
	}
	r, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: "k2"}, flaky)
	if err != nil || r.Value != 7 || r.Replayed {
		t.Fatalf("retry after a retryable error: %+v %v", r, err)
	}

	declined := func(context.Context) (int, error) {
		return 0, &idem.TerminalError{Code: "declined", Message: "card declined", Body: []byte(`{"x":1}`)}
	}
	_, err = idem.Do(ctx, e, idem.Request{Operation: scope, Key: "k3"}, declined)
	var te *idem.TerminalError
	if !errors.As(err, &te) || te.Replayed {
		t.Fatalf("first terminal error: %v", err)
	}
	res, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: "k3"}, func(context.Context) (int, error) {
		t.Error("operation ran after a terminal error was stored")
		return 0, nil
	})
	if !errors.As(err, &te) || !te.Replayed || te.Code != "declined" || string(te.Body) != `{"x":1}` || !res.Replayed {
		t.Fatalf("replayed terminal error: %+v, %v", res, err)
	}
}

// TestStorm: StormGoroutines callers, each with its own engine (no
// in-process sharing), race for one key, StormRounds times: exactly one
// execution per round, and every caller either ran it, replayed it or was
// told it was in progress.
func TestStorm(t *testing.T, f Features, newStore NewStore) {
	f = f.withDefaults()
	s := newStore(t)
	ctx := context.Background()
	engines := make([]*idem.Engine, f.StormGoroutines)
	for i := range engines {
		engines[i], _ = engineFor(t, s, idem.Config{})
	}
	scope := fmt.Sprintf("storm%x", rand.Uint32())
	for round := range f.StormRounds {
		var runs, replays, busy atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		key := fmt.Sprintf("round-%d", round)
		for i := range engines {
			wg.Add(1)
			go func(e *idem.Engine) {
				defer wg.Done()
				<-start
				res, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: key}, func(context.Context) (int, error) {
					runs.Add(1)
					return round, nil
				})
				switch {
				case errors.Is(err, idem.ErrInProgress):
					busy.Add(1)
				case err != nil:
					t.Errorf("round %d: %v", round, err)
				case res.Value != round:
					t.Errorf("round %d: got value %d", round, res.Value)
				case res.Replayed:
					replays.Add(1)
				}
			}(engines[i])
		}
		close(start)
		wg.Wait()
		if runs.Load() != 1 {
			t.Fatalf("round %d: %d executions for one key, want exactly 1 (replays %d, in progress %d)",
				round, runs.Load(), replays.Load(), busy.Load())
		}
		if got := 1 + replays.Load() + busy.Load(); got != int64(f.StormGoroutines) {
			t.Fatalf("round %d: %d callers accounted for, want %d", round, got, f.StormGoroutines)
		}
	}
}

// TestManyKeysWithRepeats: callers spread over ManyKeys keys, each key
// requested several times concurrently, retrying while in progress: the
// number of executions equals the number of distinct keys.
func TestManyKeysWithRepeats(t *testing.T, f Features, newStore NewStore) {
	f = f.withDefaults()
	s := newStore(t)
	ctx := context.Background()
	const repeats, workers = 4, 16
	scope := fmt.Sprintf("many%x", rand.Uint32())
	var calls []int
	for k := range f.ManyKeys {
		for range repeats {
			calls = append(calls, k)
		}
	}
	rand.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })
	var runs sync.Map
	var total atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		e, _ := engineFor(t, s, idem.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				for {
					res, err := idem.Do(ctx, e, idem.Request{Operation: scope, Key: fmt.Sprint(k)}, func(context.Context) (int, error) {
						total.Add(1)
						n, _ := runs.LoadOrStore(k, new(atomic.Int32))
						n.(*atomic.Int32).Add(1)
						return k * 10, nil
					})
					if errors.Is(err, idem.ErrInProgress) {
						continue // the holder is about to finish
					}
					if err != nil || res.Value != k*10 {
						t.Errorf("key %d: %+v %v", k, res, err)
					}
					break
				}
			}
		}()
	}
	for _, k := range calls {
		work <- k
	}
	close(work)
	wg.Wait()
	if total.Load() != int64(f.ManyKeys) {
		t.Fatalf("%d executions for %d distinct keys", total.Load(), f.ManyKeys)
	}
	runs.Range(func(k, v any) bool {
		if n := v.(*atomic.Int32).Load(); n != 1 {
			t.Errorf("key %v ran %d times", k, n)
		}
		return true
	})
}

// TestAdmin: a store with the optional Lister and Deleter powers lists by
// status and stuck-past-lease, pages through everything, and deletes one
// record. Skipped for stores without them. The listing of everything covers
// 45 records (a store that lists only one node of a cluster, or one shard
// of anything, misses some of them: the chance that 45 random keys all
// fall on one of three nodes is 3^-44).
func TestAdmin(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	lister, okL := s.(store.Lister)
	deleter, okD := s.(store.Deleter)
	if !okL && !okD {
		t.Skip("store implements neither store.Lister nor store.Deleter")
	}
	ctx := context.Background()
	now := base()
	mk := func(status store.Status, leaseLeft int64) string {
		key := newKey(t)
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now - 1000, LeaseUntil: now + leaseLeft, ExpiresAt: now + expiry})
		if err != nil {
			t.Fatal(err)
		}
		switch status {
		case store.StatusCompleted:
			err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: res.Record.Owner, Now: now - 1000}, ExpiresAt: now + expiry, Result: []byte("r")})
		case store.StatusFailed:
			err = s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: res.Record.Owner, Now: now - 1000}, ExpiresAt: now + expiry, Err: store.ErrorRecord{Code: "c"}})
		}
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	stuck := map[string]bool{mk(store.StatusInProgress, -1): true, mk(store.StatusInProgress, -500): true}
	live := mk(store.StatusInProgress, lease)
	done := mk(store.StatusCompleted, lease)
	failed := mk(store.StatusFailed, lease)
	mine := map[string]bool{live: true, done: true, failed: true}
	for k := range stuck {
		mine[k] = true
	}
	spread := map[string]bool{} // in progress, so no status or stuck filter lists them
	for range 40 {
		k := mk(store.StatusInProgress, lease)
		spread[k], mine[k] = true, true
	}
	if okL {
		collect := func(p store.ListParams) map[string]store.Status {
			got := map[string]store.Status{}
			p.Now, p.Limit = now, 7
			for range 10_000 {
				page, err := lister.List(ctx, p)
				if err != nil {
					t.Fatalf("List(%+v): %v", p, err)
				}
				if len(page.Records) > 7 {
					t.Fatalf("List returned %d records with Limit 7", len(page.Records))
				}
				for _, r := range page.Records {
					if mine[r.Key] {
						got[r.Key] = r.Status
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
		all := collect(store.ListParams{})
		if len(all) != len(mine) {
			t.Errorf("List of everything found %d of this test's %d records (a store on several nodes must list every node)", len(all), len(mine))
		}
		if got := collect(store.ListParams{Status: store.StatusInProgress}); len(got) != 3+len(spread) {
			t.Errorf("List(IN_PROGRESS) found %d of this test's %d in-progress records", len(got), 3+len(spread))
		}
		if got := collect(store.ListParams{Status: store.StatusFailed}); len(got) != 1 || got[failed] != store.StatusFailed {
			t.Errorf("List(FAILED) = %v, want only %s", got, failed)
		}
		if got := collect(store.ListParams{Status: store.StatusCompleted}); len(got) != 1 || got[done] != store.StatusCompleted {
			t.Errorf("List(COMPLETED) = %v", got)
		}
		got := collect(store.ListParams{Stuck: true})
		if len(got) != len(stuck) {
			t.Errorf("List(stuck) = %v, want the %d stuck records", got, len(stuck))
		}
		for k := range got {
			if !stuck[k] {
				t.Errorf("List(stuck) listed %s, which is not stuck", k)
			}
		}
	}
	if okD {
		if err := deleter.Delete(ctx, failed); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := s.Get(ctx, failed); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		if err := deleter.Delete(ctx, failed); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Delete of an absent key: %v, want ErrNotFound", err)
		}
	}
}
