package store_test

import (
	"encoding/hex"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

func sampleRecords() []*store.Record {
	return []*store.Record{
		{Key: "charge#" + idem.Digest([]byte("a")), Status: store.StatusInProgress, Fence: 3, Owner: "host/1/ab/7",
			LeaseUntil: 1_900_000_000_000, ExpiresAt: 1_900_003_600_000, Fingerprint: idem.Digest([]byte("p")),
			CreatedAt: 1_899_999_999_000, Version: 1},
		{Key: "held#" + idem.Digest([]byte("h")), Status: store.StatusInProgress, Fence: 2, Owner: "o", LeaseUntil: 10, ExpiresAt: 20, Version: 1, Hold: true},
		{Key: "k", Status: store.StatusCompleted, Fence: 1, Result: []byte{0, 1, 0xff}, Ref: "arn:aws:states:x", CompletedAt: 5, Version: 1},
		{Key: "k", Status: store.StatusCompleted, Fence: 1, Result: []byte{}, Version: 1},
		{Key: "k", Status: store.StatusFailed, Fence: 9, Err: &store.ErrorRecord{Code: "declined", Message: "no", Body: []byte(`{}`)}, Version: 1, LeaseUntil: -5},
		{Key: "k", Status: store.StatusInProgress, Fence: 2, Owner: "o", LeaseUntil: 9, ExpiresAt: 99, Version: 1, Steps: []store.Step{
			{Name: "charge", Result: []byte{0, 0xff}, At: 7},
			{Name: "email", Err: &store.ErrorRecord{Code: "refused", Message: "full", Body: []byte(`{"smtp":552}`)}, At: -8},
			{Name: "empty", Result: []byte{}, At: 9},
			{Name: "nothing", At: 10},
		}},
	}
}

// A record without steps is encoded as it was before steps existed: the
// bytes of sampleRecords()[3] as the format wrote them then.
func TestRecordCodecWithoutStepsUnchanged(t *testing.T) {
	t.Parallel()
	const before = "494452010302090109000000016b000000086465636c696e6564026e6f027b7df4e103e5"
	if got := hex.EncodeToString(store.MarshalRecord(sampleRecords()[3])); got != before {
		t.Fatalf("encoding of a record without steps changed:\n got %s\nwant %s", got, before)
	}
}

func TestRecordCodecRoundTrip(t *testing.T) {
	t.Parallel()
	for _, r := range sampleRecords() {
		got, err := store.UnmarshalRecord(store.MarshalRecord(r))
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("round trip of %+v: %+v %v", r, got, err)
		}
	}
}

func TestRecordCodecDetectsEveryBitFlip(t *testing.T) {
	t.Parallel()
	for _, r := range []*store.Record{sampleRecords()[3], sampleRecords()[4]} {
		detectsEveryBitFlip(t, store.MarshalRecord(r))
	}
}

func detectsEveryBitFlip(t *testing.T, b []byte) {
	t.Helper()
	for i := range b {
		for bit := range 8 {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << bit
			if _, err := store.UnmarshalRecord(c); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("flip of bit %d in byte %d: %v, want ErrCorrupt", bit, i, err)
			}
		}
	}
	for n := range b {
		if _, err := store.UnmarshalRecord(b[:n]); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
}

func FuzzUnmarshalRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(store.MarshalRecord(r))
	}
	f.Add([]byte("IDR\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := store.UnmarshalRecord(data)
		if err != nil {
			if !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if !r.Status.Valid() {
			t.Fatalf("decoded an invalid status %d", r.Status)
		}
		again, err := store.UnmarshalRecord(store.MarshalRecord(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding changed the record: %+v -> %+v (%v)", r, again, err)
		}
	})
}

// TestRecordCodecGolden: the binary format of this release's records,
// pinned by files: a record encodes to its file, and the file decodes to
// the record.
func TestRecordCodecGolden(t *testing.T) {
	t.Parallel()
	for _, g := range storetest.GoldenRecords() {
		b := storetest.GoldenFile(t, filepath.Join("testdata", "golden", g.Name+".idr"), store.MarshalRecord(&g.Record))
		got, err := store.UnmarshalRecord(b)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		storetest.CheckGolden(t, g, got)
	}
}
