package idem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// TestFingerprintStoredWithItsRules: every record the engine writes names
// the version of the fingerprint rules that made its fingerprint — by Do,
// by Begin and by DoBatch.
func TestFingerprintStoredWithItsRules(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	fn := func(context.Context) (string, error) { return "ok", nil }
	stored := func(r idem.Request) string {
		t.Helper()
		id, err := r.Identity()
		if err != nil {
			t.Fatal(err)
		}
		rec, err := en.mem.Get(ctx, id.StoreKey.String())
		if err != nil {
			t.Fatal(err)
		}
		if want := "v1:" + id.Fingerprint; rec.Fingerprint != want {
			t.Errorf("%s: stored fingerprint %q, want %q", r.Key, rec.Fingerprint, want)
		}
		return rec.Fingerprint
	}
	if _, err := idem.Do(ctx, en.eng, req("do"), fn); err != nil {
		t.Fatal(err)
	}
	stored(req("do"))
	if _, err := en.eng.Begin(ctx, req("begin"), nil); err != nil {
		t.Fatal(err)
	}
	stored(req("begin"))
	br := req("batch")
	bid, err := br.Identity()
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := idem.DoBatch(ctx, en.eng, []idem.Identity{bid}, nil, func(context.Context, int) (string, error) { return "ok", nil }); errs[0] != nil {
		t.Fatal(errs[0])
	}
	stored(req("batch"))
	noPayload := idem.Request{Operation: "charge", Key: "none"}
	if _, err := idem.Do(ctx, en.eng, noPayload, fn); err != nil {
		t.Fatal(err)
	}
	id, _ := noPayload.Identity()
	if rec, err := en.mem.Get(ctx, id.StoreKey.String()); err != nil || rec.Fingerprint != "" {
		t.Errorf("no payload: stored fingerprint %q (%v), want none", rec.Fingerprint, err)
	}
}

// TestFingerprintByOtherRules: a record whose fingerprint was made by rules
// this release cannot apply (written by another release during an upgrade
// or a rollback) is answered by its record — replayed, or in progress —
// never by a mismatch; one made by this release's rules still is.
func TestFingerprintByOtherRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	en := setup(t, idem.Config{CacheEntries: 10_000})
	now := store.Millis(en.clock.Now())
	write := func(key, fingerprint string, complete bool) {
		t.Helper()
		r := req(key)
		id, err := r.Identity()
		if err != nil {
			t.Fatal(err)
		}
		res, err := en.mem.Claim(ctx, store.ClaimParams{Key: id.StoreKey.String(), Fingerprint: fingerprint, Owner: "another release",
			Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
		if err != nil || !res.Acquired {
			t.Fatal(res, err)
		}
		if complete {
			if err := en.mem.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: id.StoreKey.String(), Fence: res.Record.Fence, Owner: "another release", Now: now},
				ExpiresAt: now + 3_600_000, Result: []byte(`"theirs"`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ran := false
	fn := func(context.Context) (string, error) { ran = true; return "ours", nil }

	write("v2-done", "v2:"+hexSHA256("made by other rules"), true)
	for i := range 2 { // the store, then the local cache
		r, err := idem.Do(ctx, en.eng, req("v2-done"), fn)
		if err != nil || !r.Replayed || r.Value != "theirs" || ran {
			t.Fatalf("call %d of a record made by other rules: %+v %v ran=%v; want its replay", i, r, err, ran)
		}
	}
	write("v2-running", "v2:"+hexSHA256("made by other rules"), false)
	if _, err := idem.Do(ctx, en.eng, req("v2-running"), fn); !errors.Is(err, idem.ErrInProgress) || ran {
		t.Fatalf("record in progress made by other rules: %v ran=%v; want ErrInProgress", err, ran)
	}
	if b, err := en.eng.Begin(ctx, req("v2-running"), nil); err != nil || b.Acquired {
		t.Fatalf("Begin on a record in progress made by other rules: %+v %v; want its state", b, err)
	}

	write("v1-other", "v1:"+hexSHA256("another payload"), true)
	var me *idem.MismatchError
	if _, err := idem.Do(ctx, en.eng, req("v1-other"), fn); !errors.As(err, &me) || ran {
		t.Fatalf("record by this release's rules, other payload: %v ran=%v; want a mismatch", err, ran)
	}
	if me.Stored[:3] != "v1:" || me.Got[:3] != "v1:" {
		t.Errorf("MismatchError %+v: want both fingerprints in stored form", me)
	}
}

// hexSHA256 is the lowercase hex SHA-256 of s, a fingerprint's digest.
func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
