package memstore_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T) store.Store {
	s := memstore.New(&memstore.Config{MaxResultBytes: 4 << 20})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: 4 << 20, StormGoroutines: 1000, StormRounds: 5}, newStore)
}

func TestFullStoreFailsClosedAndNeverEvictsLive(t *testing.T) {
	t.Parallel()
	s := memstore.New(&memstore.Config{MaxRecords: 2, SweepInterval: -1})
	defer s.Close()
	ctx := context.Background()
	claim := func(key string, now int64) error {
		_, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 100})
		return err
	}
	if err := claim("a", 0); err != nil {
		t.Fatal(err)
	}
	if err := claim("b", 0); err != nil {
		t.Fatal(err)
	}
	err := claim("c", 50)
	if !errors.Is(err, memstore.ErrFull) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim into a full store: %v, want ErrFull wrapping ErrUnavailable", err)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := s.Get(ctx, k); err != nil {
			t.Fatalf("live record %s evicted: %v", k, err)
		}
	}
	// Once the records expire, a claim makes room by dropping them.
	if err := claim("c", 100); err != nil {
		t.Fatalf("claim after the others expired: %v", err)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d, want 1 after expired records were dropped", s.Len())
	}
}

func TestSweeperDeletesExpiredAndStopsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(&memstore.Config{SweepInterval: time.Minute})
		ctx := context.Background()
		now := time.Now().UnixMilli()
		for i, exp := range []int64{now + 30_000, now + 90_000, now + 3_600_000} {
			key := string(rune('a' + i))
			if _, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now, LeaseUntil: now + 10, ExpiresAt: exp}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Minute) // fake time inside the bubble
		synctest.Wait()
		if s.Len() != 2 {
			t.Fatalf("after 1m: %d records, want 2 (one expired at 30s)", s.Len())
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if s.Len() != 1 {
			t.Fatalf("after 2m: %d records, want 1", s.Len())
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// The bubble ends only if the sweeper goroutine has exited.
	})
}
