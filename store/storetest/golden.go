package storetest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Golden is a record of the format this release writes, as a store must
// keep it and give it back: the fingerprint in the engine's stored form
// (the version of the fingerprint rules, ':' and the digest), every field
// set that a record can carry. A store pins its own layout by encoding each
// golden record (made with [MakeGolden]) and comparing the bytes with a
// file of its testdata, and by decoding that file: a change of the format,
// in any store, fails its test (docs/state-machine.md, "The fingerprint and
// the rules that made it").
type Golden struct {
	// Name names the record in test output and testdata files.
	Name string
	// Record is the record as Get returns it.
	Record store.Record
	// Previous, when not empty, is the owner of an earlier claim whose
	// lease had passed: the record's claim took it over (fence 2).
	Previous string
}

// goldenNow is the golden records' time: 2100-01-01, so they are never
// expired when a test reads them.
const goldenNow = 4_102_444_800_000

// GoldenRecords returns the golden records, a new copy on every call.
func GoldenRecords() []Golden {
	key := func(op, tenant, material string) string {
		k, err := idem.NewStoreKey(op, tenant, []byte(material))
		if err != nil {
			panic(err)
		}
		return k.String()
	}
	fp := func(payload string) string { return "v1:" + idem.Digest([]byte(payload)) }
	const t = goldenNow
	return []Golden{
		{Name: "in-progress", Record: store.Record{
			Key: key("charge", "tenant-7", "order-1001"), Status: store.StatusInProgress, Fence: 1,
			Owner: "host-1/4242/3f9a0c1d.7", LeaseUntil: t + 30_000, ExpiresAt: t + 86_400_000,
			Fingerprint: fp(`{"amount":100,"currency":"EUR"}`), CreatedAt: t, Version: store.RecordVersion}},
		{Name: "completed", Record: store.Record{
			Key: key("charge", "", "order-1002"), Status: store.StatusCompleted, Fence: 1,
			Owner: "host-1/4242/3f9a0c1d.8", LeaseUntil: t + 30_000, ExpiresAt: t + 1_250 + 86_400_000,
			Fingerprint: fp(`{"amount":250,"currency":"EUR"}`), Result: []byte(`{"id":"ch_1002","status":"paid"}`),
			CreatedAt: t, CompletedAt: t + 1_250, Version: store.RecordVersion}},
		{Name: "failed-after-takeover", Previous: "host-2/77/aa01.1", Record: store.Record{
			Key: key("transfer", "acct:99", "t-0f3a"), Status: store.StatusFailed, Fence: 2,
			Owner: "host-1/4242/3f9a0c1d.9", LeaseUntil: t + 60_000, ExpiresAt: t + 2_000 + 86_400_000,
			Fingerprint: fp(`{"to":"DE89","amount":"12.30"}`),
			Err:         &store.ErrorRecord{Code: "insufficient_funds", Message: "balance below 12.30", Body: []byte(`{"balance":"4.10"}`)},
			Ref:         "arn:aws:states:eu-west-1:123456789012:execution:transfers:t-0f3a",
			CreatedAt:   t, CompletedAt: t + 2_000, Version: store.RecordVersion}},
		{Name: "no-payload", Record: store.Record{
			Key: key("nightly.report", "", "2099-12-31"), Status: store.StatusCompleted, Fence: 1,
			Owner: "cron/1/ff.1", LeaseUntil: t + 30_000, ExpiresAt: t + 10 + 86_400_000,
			Result: []byte("null"), CreatedAt: t, CompletedAt: t + 10, Version: store.RecordVersion}},
	}
}

// MakeGolden writes g's record into s through the store's own operations
// (a claim, a takeover, an attach, an outcome), as the engine makes such a
// record.
func MakeGolden(t *testing.T, s store.Store, g Golden) {
	t.Helper()
	ctx := context.Background()
	r := g.Record
	if g.Previous != "" {
		res, err := s.Claim(ctx, store.ClaimParams{Key: r.Key, Fingerprint: r.Fingerprint, Owner: g.Previous,
			Now: r.CreatedAt - 60_000, LeaseUntil: r.CreatedAt - 1, ExpiresAt: r.ExpiresAt})
		if err != nil || !res.Acquired {
			t.Fatalf("golden %s: the earlier claim: %+v %v", g.Name, res, err)
		}
	}
	res, err := s.Claim(ctx, store.ClaimParams{Key: r.Key, Fingerprint: r.Fingerprint, Owner: r.Owner,
		Now: r.CreatedAt, LeaseUntil: r.LeaseUntil, ExpiresAt: r.ExpiresAt})
	if err != nil || !res.Acquired || res.Record.Fence != r.Fence {
		t.Fatalf("golden %s: claim: %+v %v", g.Name, res, err)
	}
	ref := store.ClaimRef{Key: r.Key, Fence: r.Fence, Owner: r.Owner, Now: r.CreatedAt + 1}
	if r.Ref != "" {
		if err := s.Extend(ctx, store.ExtendParams{ClaimRef: ref, Ref: r.Ref}); err != nil {
			t.Fatalf("golden %s: attach: %v", g.Name, err)
		}
	}
	ref.Now = r.CompletedAt
	switch r.Status {
	case store.StatusCompleted:
		err = s.Complete(ctx, store.CompleteParams{ClaimRef: ref, ExpiresAt: r.ExpiresAt, Result: r.Result})
	case store.StatusFailed:
		err = s.Fail(ctx, store.FailParams{ClaimRef: ref, ExpiresAt: r.ExpiresAt, Err: *r.Err})
	}
	if err != nil {
		t.Fatalf("golden %s: outcome: %v", g.Name, err)
	}
}

// CheckGolden fails t unless got is g's record, field by field.
func CheckGolden(t *testing.T, g Golden, got *store.Record) {
	t.Helper()
	sameRecord(t, "golden "+g.Name, got, &g.Record)
}

// GoldenFile fails t unless enc, a golden record as a store lays it out,
// is the content of the file at path (in the store's testdata), and
// returns that content for the store's decoder to read. A difference is a
// change of the store's format. With IDEM_UPDATE_GOLDEN=1 in the
// environment it writes enc to path instead: for a change of the format
// made on purpose, which the CHANGELOG names.
func GoldenFile(t *testing.T, path string, enc []byte) []byte {
	t.Helper()
	if os.Getenv("IDEM_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, enc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file: %v", err)
	}
	if !bytes.Equal(enc, want) {
		t.Errorf("%s: the record is laid out differently from the golden file: a change of the stored format\n got %q\nwant %q", path, enc, want)
	}
	return want
}

// TestGoldenRecords: every golden record, made through the store's own
// operations, comes back from Get and from a conflicting claim exactly as
// this release writes it, the fingerprint's rules version included.
func TestGoldenRecords(t *testing.T, _ Features, newStore NewStore) {
	s := newStore(t)
	for _, g := range GoldenRecords() {
		MakeGolden(t, s, g)
		CheckGolden(t, g, mustGet(t, s, g.Record.Key))
		now := max(g.Record.CreatedAt, g.Record.CompletedAt) + 2
		res, err := s.Claim(context.Background(), store.ClaimParams{Key: g.Record.Key, Fingerprint: "v1:other", Owner: "someone else",
			Now: now, LeaseUntil: now + lease, ExpiresAt: now + expiry})
		if err != nil || res.Acquired {
			t.Fatalf("golden %s: conflicting claim: %+v %v", g.Name, res, err)
		}
		CheckGolden(t, g, res.Record)
	}
}
