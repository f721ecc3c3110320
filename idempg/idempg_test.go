package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idempg"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newStore returns a store on a fresh table in a schema of its own,
// dropped when the test ends, and the pool it runs on (see testenv for
// when tests skip).
func newStore(t *testing.T) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	user := os.Getenv("IDEM_PG_USER")
	if user == "" {
		user = "postgres"
	}
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://%s@%s/test?sslmode=disable", user, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := fmt.Sprintf("idempgtest_%x", rand.Uint64())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	table := schema + ".records"
	if err := pgstore.Migrate(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(pool, &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, pool
}

// DoTx: the business write and the COMPLETED record commit together; a
// duplicate replays without running; a holder that lost its claim cannot
// commit its business write; an operation's error rolls its write back.
func TestDoTxCommitsWithTheBusinessWrite(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	table := s.Config().Table + "_orders"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id text PRIMARY KEY, amount int)"); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	insert := func(id string) func(context.Context, pgx.Tx) (string, error) {
		return func(ctx context.Context, tx pgx.Tx) (string, error) {
			runs++
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 100)", id)
			return "order " + id, err
		}
	}
	count := func() (n int) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	r := idem.Request{Operation: "order", Key: "o-1"}
	for i := range 2 {
		res, err := idempg.DoTx(ctx, e, s, r, insert("o-1"))
		if err != nil || res.Value != "order o-1" || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if runs != 1 || count() != 1 {
		t.Fatalf("runs %d, rows %d; want 1 and 1", runs, count())
	}

	// A zombie: its claim is taken over while it runs; its transaction
	// must not commit.
	r2 := idem.Request{Operation: "order", Key: "o-2"}
	_, err = idempg.DoTx(ctx, e, s, r2, func(ctx context.Context, tx pgx.Tx) (string, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ('o-2', 1)"); err != nil {
			return "", err
		}
		c, _ := idem.FromContext(ctx)
		rec, err := s.Get(ctx, c.Key)
		if err != nil {
			return "", err
		}
		// Another process takes over (its clock past the lease).
		_, err = s.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "other", Fingerprint: rec.Fingerprint, Now: rec.LeaseUntil, LeaseUntil: rec.LeaseUntil + 30_000, ExpiresAt: rec.ExpiresAt})
		return "zombie", err
	})
	var fe *store.FencedError
	if !errors.As(err, &fe) {
		t.Fatalf("zombie's DoTx: %v, want *FencedError", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = 'o-2'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("zombie's business write committed (%d rows, %v)", n, err)
	}

	// An operation error rolls its writes back and releases the key.
	boom := errors.New("boom")
	_, err = idempg.DoTx(ctx, e, s, idem.Request{Operation: "order", Key: "o-3"}, func(ctx context.Context, tx pgx.Tx) (string, error) {
		_, _ = tx.Exec(ctx, "INSERT INTO "+table+" VALUES ('o-3', 1)")
		return "", boom
	})
	if !errors.Is(err, boom) || count() != 1 {
		t.Fatalf("failed operation: %v, rows %d; want boom and its write rolled back", err, count())
	}
}
