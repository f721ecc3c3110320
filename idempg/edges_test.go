package idempg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idempg"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// ordersTable creates the business table of a test next to the store's.
func ordersTable(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool) (table string, count func() int) {
	t.Helper()
	table = s.Config().Table + "_orders"
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+table+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return table, func() int {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

func record(t *testing.T, s *pgstore.Store, r idem.Request) *store.Record {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), id.StoreKey.String())
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return rec
}

// The holder's lease is lost while its operation runs: the call returns
// the store's refusal and the business write never commits.
func TestDoTxLeaseLostWhileRunningIsFenced(t *testing.T) {
	s, pool := newStore(t)
	table, count := ordersTable(t, s, pool)
	e, err := idem.New(s, &idem.Config{Lease: 3 * time.Second, RenewInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "order", Key: "lost"}
	_, err = idempg.DoTx(context.Background(), e, s, r, func(ctx context.Context, tx pgx.Tx) (string, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ('o-lost')"); err != nil {
			return "", err
		}
		c, _ := idem.FromContext(ctx)
		rec, err := s.Get(ctx, c.Key)
		if err != nil {
			return "", err
		}
		// Another process, its clock well past the lease (a renewal may
		// move the lease on meanwhile), takes the key over.
		now := rec.LeaseUntil + 20_000
		res, err := s.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "other", Fingerprint: rec.Fingerprint,
			Now: now, LeaseUntil: now + 30_000, ExpiresAt: rec.ExpiresAt})
		if err != nil {
			return "", err
		}
		if !res.Acquired {
			return "", errors.New("the other process did not take the key over")
		}
		select { // the next renewal is refused and ends the context
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return "", errors.New("the operation's context was not cancelled after the takeover")
		}
		return "zombie", nil
	})
	var fe *store.FencedError
	if !errors.As(err, &fe) || fe.CurrentOwner != "other" || !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("DoTx: %v, want a *FencedError naming the new owner (and ErrLeaseLost), not ErrUnavailable", err)
	}
	if n := count(); n != 0 {
		t.Fatalf("the holder that lost its lease committed %d orders", n)
	}
	if rec := record(t, s, r); rec == nil || rec.Owner != "other" || rec.Status != store.StatusInProgress {
		t.Fatalf("record %+v, want the new holder's claim untouched", rec)
	}
}

// A disabled engine runs the operation in a transaction of its own and
// commits its writes, with no record; its error rolls them back.
func TestDoTxDisabledWritesWithoutARecord(t *testing.T) {
	s, pool := newStore(t)
	table, count := ordersTable(t, s, pool)
	e, err := idem.New(s, &idem.Config{Disabled: true})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "order", Key: "off"}
	for _, id := range []string{"o-a", "o-b"} {
		res, err := idempg.DoTx(context.Background(), e, s, r, func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id)
			return id, err
		})
		if err != nil || res.Value != id || res.Replayed {
			t.Fatalf("%s: %+v, %v; want the operation run", id, res, err)
		}
	}
	boom := errors.New("boom")
	if _, err := idempg.DoTx(context.Background(), e, s, r, func(ctx context.Context, tx pgx.Tx) (string, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ('o-c')"); err != nil {
			return "", err
		}
		return "", boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failing operation: %v, want its error", err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d orders, want 2 (every call runs; a failed one rolls back)", n)
	}
	if rec := record(t, s, r); rec != nil {
		t.Fatalf("record %+v written by a disabled engine", rec)
	}
}

// A value over the engine's MaxResultBytes: the transaction rolls back,
// the key is FAILED with CodeResultTooLarge, and a retry gets the same
// error without running.
func TestDoTxResultOverMaxResultBytesFails(t *testing.T) {
	s, pool := newStore(t)
	table, count := ordersTable(t, s, pool)
	e, err := idem.New(s, &idem.Config{MaxResultBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "order", Key: "large"}
	runs := 0
	op := func(ctx context.Context, tx pgx.Tx) (string, error) {
		runs++
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ('o-large')")
		return strings.Repeat("x", 100), err
	}
	for i := range 2 {
		_, err := idempg.DoTx(context.Background(), e, s, r, op)
		var term *idem.TerminalError
		if !errors.Is(err, idem.ErrResultTooLarge) || !errors.As(err, &term) || term.Code != idem.CodeResultTooLarge {
			t.Fatalf("call %d: %v, want ErrResultTooLarge", i, err)
		}
	}
	if runs != 1 {
		t.Fatalf("%d runs, want 1 (the retry replays the stored error)", runs)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d orders committed with a result that was not stored", n)
	}
	if rec := record(t, s, r); rec == nil || rec.Status != store.StatusFailed || rec.Err == nil || rec.Err.Code != idem.CodeResultTooLarge {
		t.Fatalf("record %+v, want FAILED with %s", rec, idem.CodeResultTooLarge)
	}
}
