package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// writeHash stores r as the previous release wrote records: a hash of
// fields, with the key's native expiry at r.ExpiresAt.
func writeHash(t *testing.T, c *redis.Client, s *redisstore.Store, r *store.Record) {
	t.Helper()
	ctx := context.Background()
	k := s.Prefix() + r.Key
	f := []any{"st", int(r.Status), "f", r.Fence, "o", r.Owner, "l", r.LeaseUntil, "e", r.ExpiresAt,
		"fp", r.Fingerprint, "c", r.CreatedAt, "v", store.RecordVersion}
	if r.Ref != "" {
		f = append(f, "ref", r.Ref)
	}
	if r.CompletedAt != 0 {
		f = append(f, "d", r.CompletedAt)
	}
	if r.Result != nil {
		f = append(f, "r", r.Result)
	}
	if r.Err != nil {
		f = append(f, "ec", r.Err.Code, "em", r.Err.Message, "eb", r.Err.Body)
	}
	if err := c.HSet(ctx, k, f...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpireAt(ctx, k, time.UnixMilli(r.ExpiresAt)).Err(); err != nil {
		t.Fatal(err)
	}
}

// Records written by the previous release (hashes) are still read, replayed,
// settled by their holders, fenced, listed and taken over: nothing stored
// is lost on upgrade.
func TestPreviousLayout(t *testing.T) {
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	held := func(key string) *store.Record {
		return &store.Record{Key: key, Status: store.StatusInProgress, Fence: 3, Owner: "old", LeaseUntil: now + 10_000,
			ExpiresAt: now + 60_000, Fingerprint: "fp", CreatedAt: now - 5, Version: store.RecordVersion}
	}
	setup := func(t *testing.T) (*redisstore.Store, *redis.Client) {
		t.Helper()
		return newStore(t, redisstore.Config{})
	}

	t.Run("read", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t)
		done := held("r#1")
		done.Status, done.Result, done.CompletedAt, done.Ref = store.StatusCompleted, []byte(`{"id":1}`), now-1, "exec-9"
		failed := held("r#2")
		failed.Status, failed.Err, failed.CompletedAt = store.StatusFailed, &store.ErrorRecord{Code: "c", Message: "m", Body: []byte("b")}, now-1
		for _, want := range []*store.Record{held("r#0"), done, failed} {
			writeHash(t, c, s, want)
			got, err := s.Get(ctx, want.Key)
			if err != nil {
				t.Fatalf("%s: %v", want.Key, err)
			}
			if !sameRecord(got, want) {
				t.Errorf("%s: read %+v, want %+v", want.Key, got, want)
			}
		}
		page, err := s.List(ctx, store.ListParams{Now: now})
		if err != nil || len(page.Records) != 3 {
			t.Fatalf("list: %d records, %v; want the three", len(page.Records), err)
		}
	})

	t.Run("conflict and replay", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t)
		writeHash(t, c, s, held("c#1"))
		res, err := s.Claim(ctx, store.ClaimParams{Key: "c#1", Owner: "new", Fingerprint: "fp", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000})
		if err != nil || res.Acquired || res.Record.Owner != "old" || res.Record.Fence != 3 {
			t.Fatalf("claim of a live old record: %+v, %v; want a conflict with it", res, err)
		}
		res, err = s.Claim(ctx, store.ClaimParams{Key: "c#1", Owner: "old", Fingerprint: "fp", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000})
		if err != nil || !res.Acquired || res.Record.Fence != 3 {
			t.Fatalf("the old owner's retried claim: %+v, %v; want acquired, unchanged", res, err)
		}
		// An engine replays a result the previous release stored.
		e, err := idem.New(s, &idem.Config{RenewInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		r := idem.Request{Operation: "charge", Key: "paid"}
		id, _ := r.Identity()
		done := held(id.StoreKey.String())
		done.Status, done.Result, done.CompletedAt, done.Fingerprint = store.StatusCompleted, []byte(`7`), now-1, ""
		done.ExpiresAt = time.Now().Add(time.Hour).UnixMilli()
		writeHash(t, c, s, done)
		out, err := idem.Do(ctx, e, r, func(context.Context) (int, error) { return 0, errors.New("ran again") })
		if err != nil || !out.Replayed || out.Value != 7 {
			t.Fatalf("Do over an old completed record: %+v, %v; want a replay of 7", out, err)
		}
	})

	t.Run("settled by its holder", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t)
		for _, k := range []string{"s#1", "s#2", "s#3", "s#4"} {
			writeHash(t, c, s, held(k))
		}
		var fe *store.FencedError
		if err := s.Complete(ctx, store.CompleteParams{Key: "s#1", Fence: 2, Owner: "old", Now: now, ExpiresAt: now + 90_000, Result: []byte("x")}); !errors.As(err, &fe) || fe.Current != 3 {
			t.Fatalf("stale fence on an old record: %v, want FencedError at 3", err)
		}
		if err := s.Complete(ctx, store.CompleteParams{Key: "s#1", Fence: 3, Owner: "old", Now: now, ExpiresAt: now + 90_000, Result: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Get(ctx, "s#1"); err != nil || r.Status != store.StatusCompleted || string(r.Result) != "x" || r.Fingerprint != "fp" {
			t.Fatalf("completed old record: %+v, %v", r, err)
		}
		if err := s.Fail(ctx, store.FailParams{Key: "s#2", Fence: 3, Owner: "old", Now: now, ExpiresAt: now + 90_000, Err: store.ErrorRecord{Code: "c"}}); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Get(ctx, "s#2"); err != nil || r.Status != store.StatusFailed || r.Err.Code != "c" {
			t.Fatalf("failed old record: %+v, %v", r, err)
		}
		if err := s.Extend(ctx, store.ExtendParams{Key: "s#3", Fence: 3, Owner: "old", Now: now, LeaseUntil: now + 20_000, Ref: "x-1"}); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Get(ctx, "s#3"); err != nil || r.LeaseUntil != now+20_000 || r.Ref != "x-1" {
			t.Fatalf("extended old record: %+v, %v", r, err)
		}
		if err := s.Release(ctx, store.ReleaseParams{Key: "s#4", Fence: 3, Owner: "old", Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "s#4"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("released old record: %v, want ErrNotFound", err)
		}
	})

	t.Run("taken over in the current layout", func(t *testing.T) {
		t.Parallel()
		s, c := setup(t)
		writeHash(t, c, s, held("t#1")) // lease passed at now+10s
		expired := held("t#2")
		expired.Status, expired.Result, expired.CompletedAt = store.StatusCompleted, []byte("r"), now
		writeHash(t, c, s, expired) // expired at now+60s
		for key, at := range map[string]int64{"t#1": now + 20_000, "t#2": now + 61_000} {
			takeover, later := key == "t#1", at
			res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "new", Fingerprint: "fp2", Now: later, LeaseUntil: later + 1000, ExpiresAt: later + 5000})
			if err != nil || !res.Acquired || res.Takeover != takeover || res.Record.Fence != 4 {
				t.Fatalf("%s: %+v, %v; want acquired at fence 4, takeover %v", key, res, err, takeover)
			}
			if typ := c.Type(ctx, s.Prefix()+key).Val(); typ != "string" {
				t.Errorf("%s: taken over into a %s, want the current layout (string)", key, typ)
			}
			if err := s.Complete(ctx, store.CompleteParams{Key: key, Fence: 4, Owner: "new", Now: later, ExpiresAt: later + 5000, Result: []byte("ok")}); err != nil {
				t.Fatal(err)
			}
		}
		// The batch claim reads and takes over old records too.
		writeHash(t, c, s, held("t#3"))
		writeHash(t, c, s, held("t#4"))
		res, errs := s.ClaimBatch(ctx, []store.ClaimParams{
			{Key: "t#3", Owner: "b", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000},
			{Key: "t#4", Owner: "b", Now: now + 10_000, LeaseUntil: now + 11_000, ExpiresAt: now + 15_000},
		})
		if errors.Join(errs...) != nil || res[0].Acquired || res[0].Record.Owner != "old" || !res[1].Acquired || !res[1].Takeover || res[1].Record.Fence != 4 {
			t.Fatalf("batch over old records: %+v, %v", res, errs)
		}
	})
}

func sameRecord(a, b *store.Record) bool {
	if a.Err != nil || b.Err != nil {
		if a.Err == nil || b.Err == nil || a.Err.Code != b.Err.Code || a.Err.Message != b.Err.Message || string(a.Err.Body) != string(b.Err.Body) {
			return false
		}
	}
	return a.Key == b.Key && a.Status == b.Status && a.Fence == b.Fence && a.Owner == b.Owner && a.LeaseUntil == b.LeaseUntil &&
		a.ExpiresAt == b.ExpiresAt && a.Fingerprint == b.Fingerprint && string(a.Result) == string(b.Result) && a.Ref == b.Ref &&
		a.CreatedAt == b.CreatedAt && a.CompletedAt == b.CompletedAt && a.Version == b.Version
}
