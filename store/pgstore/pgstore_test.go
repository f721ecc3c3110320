package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/storefaults"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hostPort is the PostgreSQL under test (see testenv for when tests skip).
func hostPort(t testing.TB) string {
	return testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
}

func dsn(addr string) string {
	user := os.Getenv("IDEM_PG_USER")
	if user == "" {
		user = "postgres"
	}
	return fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=2", user, addr)
}

// newPool returns a pool to addr, closed when the test ends, with the
// fault suite's connect timeout.
func newPool(t testing.TB, addr string, maxConns int32) *pgxpool.Pool {
	return newPoolTimeout(t, addr, maxConns, storefaults.Timeout)
}

// newPoolTimeout is newPool with another connect timeout.
func newPoolTimeout(t testing.TB, addr string, maxConns int32, connect time.Duration) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn(addr))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.ConnectTimeout = connect
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

var schemaSeq atomic.Int64

// newSchema creates a schema for one test, dropped when it ends, and
// returns the migrated table name in it.
func newSchema(t testing.TB, pool *pgxpool.Pool) string {
	schema := fmt.Sprintf("idemtest_%d_%x", schemaSeq.Add(1), rand.Uint32())
	ctx := context.Background()
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
	return table
}

// newStore returns a store on a fresh table. Its pool connects with a
// timeout of 10s: the fault suite's 300 ms is for a server that does not
// answer, and on a busy machine (tests under -race beside others) a new
// connection to a healthy PostgreSQL sometimes takes longer than that.
func newStore(t testing.TB, cfg pgstore.Config) (*pgstore.Store, *pgxpool.Pool) {
	pool := newPoolTimeout(t, hostPort(t), 32, 10*time.Second)
	cfg.Table = newSchema(t, pool)
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = -1
	}
	s, err := pgstore.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, pool
}

const limit = 4 << 20

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		s, _ := newStore(t, pgstore.Config{MaxResultBytes: limit})
		return s
	})
}

func TestFaults(t *testing.T) {
	target := hostPort(t)
	tables := map[string]string{}
	storefaults.Run(t, target, func(t *testing.T, addr string) store.Store {
		pool := newPool(t, addr, 4)
		table, ok := tables[t.Name()]
		if !ok {
			table = newSchema(t, newPool(t, target, 2))
			tables[t.Name()] = table
		}
		s, err := pgstore.New(pool, &pgstore.Config{Table: table, ReapInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// CompleteInTx: fn's write and the COMPLETED record commit together; a
// completion refused (the claim was taken over meanwhile) or fn's error
// rolls fn's write back.
func TestCompleteInTx(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	ctx := context.Background()
	table := s.Config().Table + "_orders"
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	claim := func(key, owner string, at int64) store.CompleteParams {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: owner, Now: at, LeaseUntil: at + 10_000, ExpiresAt: now + 60_000})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
		return store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: owner, Now: at}, ExpiresAt: now + 60_000, Result: []byte("done")}
	}
	insert := func(p store.CompleteParams, err error) func(context.Context, pgx.Tx) (store.CompleteParams, error) {
		return func(ctx context.Context, tx pgx.Tx) (store.CompleteParams, error) {
			if _, xerr := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", p.Key); xerr != nil {
				return p, xerr
			}
			return p, err
		}
	}
	rows := func(key string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	p := claim("k-1", "o", now)
	if err := s.CompleteInTx(ctx, p.Key, insert(p, nil)); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, p.Key); err != nil || r.Status != store.StatusCompleted || rows(p.Key) != 1 {
		t.Fatalf("after CompleteInTx: %+v, %v, %d rows; want COMPLETED and 1 row", r, err, rows(p.Key))
	}

	// Taken over before the completion: refused, fn's write rolled back.
	p = claim("k-2", "o", now)
	claim("k-2", "other", now+10_000)
	var fe *store.FencedError
	if err := s.CompleteInTx(ctx, p.Key, insert(p, nil)); !errors.As(err, &fe) || rows(p.Key) != 0 {
		t.Fatalf("completion of a lost claim: %v, %d rows; want a *FencedError and 0 rows", err, rows(p.Key))
	}

	// fn's error: returned as it is, its write rolled back, the record untouched.
	boom := errors.New("boom")
	p = claim("k-3", "o", now)
	if err := s.CompleteInTx(ctx, p.Key, insert(p, boom)); err != boom || rows(p.Key) != 0 {
		t.Fatalf("fn's error: %v, %d rows; want boom and 0 rows", err, rows(p.Key))
	}
	if r, err := s.Get(ctx, p.Key); err != nil || r.Status != store.StatusInProgress {
		t.Fatalf("after fn's error: %+v, %v; want IN_PROGRESS", r, err)
	}
}

// counter is a pgx tracer counting statements sent.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countedStore is a store on a table of its own whose pool counts the
// statements it sends; the pool and the table are returned too.
func countedStore(t *testing.T) (*pgstore.Store, *counter, *pgxpool.Pool, string) {
	t.Helper()
	addr := hostPort(t)
	table := newSchema(t, newPool(t, addr, 2))
	cfg, err := pgxpool.ParseConfig(dsn(addr))
	if err != nil {
		t.Fatal(err)
	}
	cnt := new(counter)
	cfg.ConnConfig.Tracer = cnt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cnt, pool, table
}

func TestOneStatementPerOperation(t *testing.T) {
	s, cnt, _, _ := countedStore(t)
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	// New call: claim + complete, and the engine's first reading of the
	// server's clock (once per Config.ClockSync interval); duplicate: claim.
	for i, want := range []int64{3, 1} {
		before := cnt.n.Load()
		res, err := idem.Do(context.Background(), e, idem.Request{Operation: "s", Key: "k"}, func(context.Context) (int, error) { return 1, nil })
		if err != nil || res.Replayed != (i == 1) {
			t.Fatal(res, err)
		}
		if n := cnt.n.Load() - before; n != want {
			t.Errorf("call %d sent %d statements, want %d", i, n, want)
		}
	}
	// A refused write reads the row to explain the refusal: 2 statements.
	now := time.Now().UnixMilli()
	res, err := s.Claim(context.Background(), store.ClaimParams{Key: "held", Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
	if err != nil || !res.Acquired {
		t.Fatal(res, err)
	}
	before := cnt.n.Load()
	err = s.Complete(context.Background(), store.CompleteParams{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "other", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte("r")})
	var fe *store.FencedError
	if !errors.As(err, &fe) || fe.CurrentOwner != "o" {
		t.Fatalf("complete by another owner: %v, want a *FencedError naming o", err)
	}
	if n := cnt.n.Load() - before; n != 2 {
		t.Errorf("refused complete sent %d statements, want 2", n)
	}
}

func TestStuckListingUsesTheIndex(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET enable_seqscan") //nolint:errcheck
	var plan strings.Builder
	rows, err := conn.Query(ctx, "EXPLAIN SELECT key FROM "+s.Config().Table+" WHERE expires_at > 1 AND status = 1 AND lease_until <= 5")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		_ = rows.Scan(&line)
		plan.WriteString(line + "\n")
	}
	rows.Close()
	if !strings.Contains(plan.String(), "status_lease") {
		t.Errorf("stuck listing plan does not use the status index:\n%s", plan.String())
	}
}

func TestReaperDeletesExpiredRowsAndStopsOnClose(t *testing.T) {
	pool := newPool(t, hostPort(t), 4)
	table := newSchema(t, pool)
	clk := clocktest.New(time.UnixMilli(1_000_000))
	reaped := make(chan int, 10)
	s, err := pgstore.New(pool, &pgstore.Config{Table: table, ReapInterval: time.Minute, ReapBatch: 3, Clock: clk,
		OnReap: func(n int, err error) {
			if err != nil {
				t.Error(err)
			}
			reaped <- n
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := int64(1_000_000)
	for i := range 10 {
		exp := now + 30_000 // expires before the first reap
		if i >= 7 {
			exp = now + 3_600_000
		}
		if _, err := s.Claim(ctx, store.ClaimParams{Key: fmt.Sprintf("k%d", i), Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: exp}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Minute)
	if n := <-reaped; n != 7 {
		t.Fatalf("reaper deleted %d rows, want the 7 expired (in batches of 3)", n)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&left); err != nil || left != 3 {
		t.Fatalf("rows left %d (%v), want 3", left, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	pool := newPool(t, hostPort(t), 8)
	table := newSchema(t, pool) // migrated once
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- pgstore.Migrate(context.Background(), pool, table) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ms, err := pgstore.Migrations(table)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	schema := table[:len(table)-len(".records")]
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".idem_schema_migrations WHERE tbl = $1", table).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("recorded migrations %d (%v), want %d", n, err, len(ms))
	}
}

func TestMissingTableAndBadConfig(t *testing.T) {
	pool := newPool(t, hostPort(t), 2)
	s, err := pgstore.New(pool, &pgstore.Config{Table: "idem_no_such_table", ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Get(context.Background(), "k")
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("missing table: %v", err)
	}
	for _, tbl := range []string{"a.b.c", "a..b", "."} {
		if _, err := pgstore.New(pool, &pgstore.Config{Table: tbl}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("table %q: %v, want ErrInvalidConfig", tbl, err)
		}
	}
}

func TestDamagedRowFailsClosed(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "charge", Key: "bad"}
	id, _ := r.Identity()
	// A COMPLETED row whose result was lost, and a row from a future format.
	for _, q := range []string{
		"INSERT INTO %s (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version) VALUES ($1, 2, 1, 'o', 0, 9000000000000, '', 0, 1)",
		"UPDATE %s SET version = 2, result = 'x' WHERE key = $1",
	} {
		if _, err := pool.Exec(context.Background(), fmt.Sprintf(q, s.Config().Table), id.StoreKey.String()); err != nil {
			t.Fatal(err)
		}
		ran := false
		_, err := idem.Do(context.Background(), e, r, func(context.Context) (int, error) { ran = true; return 1, nil })
		if !errors.Is(err, store.ErrCorrupt) || ran {
			t.Fatalf("damaged row: %v, ran %v; want ErrCorrupt and no run", err, ran)
		}
	}
}

// interleaving is a DB that calls between(n) before the n-th statement
// (from 0) sent through it, so a test can commit another process's write
// in the gap between a claim's statements; n counts the statements.
type interleaving struct {
	pgstore.DB
	n       int
	between func(n int)
}

func (d *interleaving) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.between(d.n)
	d.n++
	return d.DB.Query(ctx, sql, args...)
}

// racingStore returns a store on s's table whose statements go through an
// interleaving DB.
func racingStore(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool, between func(n int)) (*pgstore.Store, *interleaving) {
	db := &interleaving{DB: pool, between: between}
	r, err := pgstore.New(db, &pgstore.Config{Table: s.Config().Table, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, db
}

// A claim whose read of the row is outdated by the time it writes still
// decides, on the row's newest version: here another process takes the
// row over between the claim's two statements. The claim used to retry
// on a fence it had read, lose the same race each round and fail with
// ErrUnavailable after 8 statements.
func TestClaimDecidesWhenTheRowChangesUnderIt(t *testing.T) {
	const t0 = int64(1_000_000)
	for _, c := range []struct {
		name      string
		lease     int64 // of the claims taken between the racer's statements
		wantFence uint64
		wantOwner string
	}{
		{"newest version claimable: taken over", 1, 3, "racer"},
		{"newest version live: conflict", 1_000, 2, "other-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, pool := newStore(t, pgstore.Config{})
			ctx := context.Background()
			claim := func(s *pgstore.Store, owner string, now, leaseUntil int64) store.ClaimResult {
				t.Helper()
				res, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: owner, Fingerprint: "f", Now: now, LeaseUntil: leaseUntil, ExpiresAt: t0 + 3_600_000})
				if err != nil {
					t.Fatalf("claim by %s: %v", owner, err)
				}
				return res
			}
			claim(s, "first", t0, t0+1)
			racer, db := racingStore(t, s, pool, func(n int) {
				if n >= 1 { // before every statement after the first read
					now := t0 + 10 + int64(n)
					if res := claim(s, fmt.Sprintf("other-%d", n), now, now+c.lease); !res.Takeover {
						t.Fatalf("claim %d between the racer's statements did not take over: %+v", n, res)
					}
				}
			})
			res := claim(racer, "racer", t0+100, t0+200)
			if res.Acquired != (c.wantOwner == "racer") || res.Takeover != res.Acquired || res.Record.Owner != c.wantOwner || res.Record.Fence != c.wantFence {
				t.Fatalf("claim = %+v, record %+v; want owner %s, fence %d", res, res.Record, c.wantOwner, c.wantFence)
			}
			if got := mustGet(t, s, "k"); !reflect.DeepEqual(got, res.Record) {
				t.Errorf("row after the claim %+v, want %+v", got, res.Record)
			}
			if db.n != 2 {
				t.Errorf("claim sent %d statements, want 2", db.n)
			}
		})
	}
}

// A claim whose first statement meets a row its snapshot cannot see (the
// inserting transaction commits while the INSERT waits for it) reads once
// more and answers from the row; if the row it meets then is again one
// its snapshot cannot see, the upsert decides. Either way the holder's row
// is unchanged.
func TestClaimSeesARowCommittedDuringItsStatement(t *testing.T) {
	const now = int64(1_000_000)
	for _, c := range []struct {
		name  string
		twice bool
		want  int // statements
	}{
		{"once: read again", false, 2},
		{"twice: upsert", true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, pool := newStore(t, pgstore.Config{})
			ctx := context.Background()
			table := s.Config().Table
			// insert begins a transaction inserting the holder's row and
			// commits it once another session waits for it.
			insert := func(holder string) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var pid uint32
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version) VALUES ('k', 1, 1, $1, $2, $3, 'f', $4, $5)",
					holder, now+10_000, now+3_600_000, now, store.RecordVersion); err != nil {
					t.Fatal(err)
				}
				go func() {
					for waited := false; !waited; {
						if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))", pid).Scan(&waited); err != nil {
							t.Error(err)
							break
						}
					}
					if err := tx.Commit(ctx); err != nil {
						t.Error(err)
					}
				}()
			}
			racer, db := racingStore(t, s, pool, func(n int) {
				if n == 1 && c.twice { // the row is replaced, uncommitted again
					if _, err := pool.Exec(ctx, "DELETE FROM "+table+" WHERE key = 'k'"); err != nil {
						t.Error(err)
					}
					insert("holder-2")
				}
			})
			insert("holder")
			res, err := racer.Claim(ctx, store.ClaimParams{Key: "k", Owner: "racer", Fingerprint: "f", Now: now + 1, LeaseUntil: now + 10_001, ExpiresAt: now + 3_600_001})
			if err != nil || res.Acquired || res.Record == nil {
				t.Fatalf("claim = %+v, %v; want a conflict", res, err)
			}
			got := mustGet(t, s, "k")
			want := store.Record{Key: "k", Status: store.StatusInProgress, Fence: 1, Owner: "holder", LeaseUntil: now + 10_000, ExpiresAt: now + 3_600_000,
				Fingerprint: "f", CreatedAt: now, Version: store.RecordVersion}
			if c.twice {
				want.Owner = "holder-2"
			}
			if !reflect.DeepEqual(*got, want) || !reflect.DeepEqual(*res.Record, want) {
				t.Fatalf("claim answered %+v, row is %+v; want both %+v", res.Record, got, want)
			}
			if db.n != c.want {
				t.Errorf("claim sent %d statements, want %d", db.n, c.want)
			}
		})
	}
}

func mustGet(t *testing.T, s *pgstore.Store, key string) *store.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A fenced write that waits for the row's lock while the row is deleted (a
// sweeper, an operator, the holder's own Release) is refused as not found:
// its statement's snapshot still shows the row it would have matched, so
// that row cannot explain the refusal.
func TestFencedWriteBehindAReleaseIsNotFound(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	ctx := context.Background()
	const now = int64(1_000_000)
	if _, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Fingerprint: "f", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 3_600_000}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+s.Config().Table+" WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now + 1}, ExpiresAt: now + 3_600_000, Result: []byte("r")})
	}()
	for waited := false; !waited; {
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))", pid).Scan(&waited); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("complete behind a release: %v, want ErrNotFound", err)
	}
}

// A settled row corrected by its claim (From) keeps no column of its
// former outcome: scanRecord reads the result only of a COMPLETED row and
// the error only of a FAILED one, so the conformance suite cannot see a
// column left behind. Extend with only a Ref keeps the lease.
func TestResettleClearsOldOutcome(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	ctx := context.Background()
	const now = int64(1_000_000)
	if _, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Fingerprint: "f", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 3_600_000}); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now}, Ref: "exec-1"}); err != nil {
		t.Fatal(err)
	}
	type row struct {
		lease                int64
		result, errBody      []byte
		errCode, errMsg, ref *string
	}
	read := func() row {
		t.Helper()
		var r row
		if err := pool.QueryRow(ctx, "SELECT lease_until, result, err_code, err_message, err_body, ref FROM "+s.Config().Table+" WHERE key = 'k'").
			Scan(&r.lease, &r.result, &r.errCode, &r.errMsg, &r.errBody, &r.ref); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := read(); r.lease != now+10_000 || r.ref == nil || *r.ref != "exec-1" {
		t.Fatalf("after attaching: lease %d, ref %v; want the lease unchanged and exec-1", r.lease, r.ref)
	}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Err: store.ErrorRecord{Code: "c", Message: "m", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 3_600_001, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.errCode != nil || r.errMsg != nil || r.errBody != nil || string(r.result) != "r" || r.ref == nil || *r.ref != "exec-1" {
		t.Errorf("COMPLETED from FAILED: %+v; want the result, the ref and no error columns", r)
	}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", From: store.StatusCompleted, Now: now + 2}, ExpiresAt: now + 3_600_002, Err: store.ErrorRecord{Code: "c"}}); err != nil {
		t.Fatal(err)
	}
	if r := read(); r.result != nil {
		t.Errorf("FAILED from COMPLETED still has the result %q", r.result)
	}
}

// A fenced write From a settled status that waits for the row's lock while
// the same claim settles the row otherwise is refused with the row's new
// status: its statement's snapshot still shows the status it expected, so
// the write runs again on a new snapshot to explain the refusal.
func TestFencedWriteBehindAResettleReportsNewStatus(t *testing.T) {
	s, pool := newStore(t, pgstore.Config{})
	ctx := context.Background()
	const now = int64(1_000_000)
	if _, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Fingerprint: "f", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 3_600_000}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Err: store.ErrorRecord{Code: "c"}}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteTx(ctx, tx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 3_600_000, Result: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 3_600_000, Result: []byte("second")})
	}()
	for waited := false; !waited; {
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))", pid).Scan(&waited); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var fe *store.FencedError
	if err := <-done; !errors.As(err, &fe) || !fe.Own() || fe.Status != store.StatusCompleted {
		t.Fatalf("complete From FAILED behind another: %v, want an own *FencedError with status COMPLETED", err)
	}
	if r := mustGet(t, s, "k"); string(r.Result) != "first" {
		t.Errorf("result %q, want the first write's", r.Result)
	}
}
