// Package pgstore is the idem store on PostgreSQL (pgx v5).
//
// # One statement per operation
//
// Claim is one INSERT … ON CONFLICT DO NOTHING, which returns either the
// new claim or, on conflict, the existing row in the same round trip; a
// duplicate takes no lock and writes nothing. Replacing an expired row or
// one past its lease is a second statement, INSERT … ON CONFLICT DO
// UPDATE, which decides on the row's newest version under its lock; a
// claim that raced another's insert reads once more first. A claim is at
// most three statements, whatever the contention. A new claim is not
// decoded: the store builds the record it just inserted. Complete, Fail,
// Release, Extend and RecordStep are one plain fenced UPDATE or DELETE each, the same
// statement a hand-written check would send; only a refused write costs
// a second statement, a read of the row that explains the refusal (not
// found / fenced).
//
// A batch is one statement too: [Store.ClaimBatch] claims every key of a
// batch with one multi-row INSERT … ON CONFLICT DO UPDATE, and
// [Store.CompleteBatch] and [Store.ExtendBatch] make a batch's Completes,
// or renew its leases, with one fenced UPDATE … FROM the batch's rows that
// answers each row's outcome.
//
// # Completing inside your transaction
//
// [Store.CompleteInTx] runs a function inside a transaction and completes
// the record in that same transaction: the business write and the
// COMPLETED record commit together or not at all, and a holder that lost
// its claim (fence moved on after a takeover) cannot commit its business
// write either. This is the transactional-outbox strength that stores
// outside the database lack. [Store.CompleteTx] completes inside a
// transaction of the caller's. DoTx in module
// github.com/seed-a1b882c0/idem/idempg runs an engine call this way; it
// lives there so that this store depends on package store alone.
//
// # Schema
//
// The schema is a set of embedded, numbered migrations applied by
// [Migrate] (idemctl calls it too), recorded in idem_schema_migrations and
// serialised with an advisory lock. An index on (status, lease_until)
// makes "by status" and "stuck past lease" listings cheap; one on
// expires_at serves the reaper, a goroutine deleting expired rows in
// batches, which stops on Close.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem/store"
)

// DB is what the store needs of a connection pool; *pgxpool.Pool and
// *pgx.Conn (single connection, not for concurrent use) have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Table is the records table, optionally schema-qualified
	// ("ops.idem_records"). Default "idem_records".
	Table string
	// MaxResultBytes bounds a stored result or error. Default 16 MiB.
	MaxResultBytes int
	// ReapInterval is how often expired rows are deleted. Default 1m;
	// negative disables the reaper.
	ReapInterval time.Duration
	// ReapBatch is how many rows one reaper statement deletes at most.
	// Default 1,000.
	ReapBatch int
	// OnReap, when set, is called after each reaper run with the rows
	// deleted and the error, if any.
	OnReap func(n int, err error)
	// Clock drives the reaper. Default store.SystemClock.
	Clock store.Clock
}

// Store is an [store.Store] on one PostgreSQL table. It also implements
// [store.Lister] and [store.Deleter].
type Store struct {
	db    DB
	cfg   Config
	table string // quoted
	owned *pgxpool.Pool
	sql   statements
	bsql  batchStatements

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// SystemName implements store.SystemNamer: the backend's db.system.name in
// the OpenTelemetry database semantic conventions, "postgresql".
func (s *Store) SystemName() string { return "postgresql" }

var (
	_ store.Store   = (*Store)(nil)
	_ store.Lister  = (*Store)(nil)
	_ store.Deleter = (*Store)(nil)
)

func (c Config) withDefaults() (Config, error) {
	if c.Table == "" {
		c.Table = "idem_records"
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = 16 << 20
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Minute
	}
	if c.ReapBatch == 0 {
		c.ReapBatch = 1000
	}
	if c.MaxResultBytes < 0 || c.ReapBatch < 0 {
		return c, fmt.Errorf("pgstore: negative MaxResultBytes or ReapBatch: %w", store.ErrInvalidConfig)
	}
	if c.Clock == nil {
		c.Clock = store.SystemClock{}
	}
	return c, nil
}

// New returns a store on db (usually a *pgxpool.Pool). The table must
// exist: call [Migrate] first. The reaper starts now and stops on Close;
// Close does not close db.
func New(db DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("pgstore: nil DB: %w", store.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	table, err := quoteTable(c.Table)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, cfg: c, table: table, sql: newStatements(table), bsql: newBatchStatements(table), stop: make(chan struct{}), done: make(chan struct{})}
	if c.ReapInterval > 0 {
		go store.Every(s.stop, s.done, s.cfg.Clock.After, s.cfg.ReapInterval, func() {
			n, err := s.Reap(context.Background(), store.Millis(s.cfg.Clock.Now()))
			if s.cfg.OnReap != nil {
				s.cfg.OnReap(n, err)
			}
		})
	} else {
		close(s.done)
	}
	return s, nil
}

// Open connects a pool to url (a PostgreSQL URL or DSN), applies the
// migrations, checks the role's privileges on the table ([Store.Check])
// and returns a store that owns the pool. A role that may not migrate or
// use the table fails with a [*PrivilegeError] saying what to grant; a
// connection refused for good (a wrong password, a role or database that
// does not exist) with a [*ConnectError] saying what to fix. Both match
// store.ErrMisconfigured: no retry mends them.
func Open(ctx context.Context, url string, cfg *Config) (*Store, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w: %w", store.ErrInvalidConfig, err)
	}
	table := "idem_records"
	if cfg != nil && cfg.Table != "" {
		table = cfg.Table
	}
	if err := Migrate(ctx, pool, table); err != nil {
		pool.Close()
		return nil, err
	}
	s, err := New(pool, cfg)
	if err == nil {
		err = s.Check(ctx)
	}
	if err != nil {
		if s != nil {
			_ = s.Close()
		}
		pool.Close()
		return nil, err
	}
	s.owned = pool
	return s, nil
}

// Close stops the reaper and closes the pool if the store opened it.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	if s.owned != nil {
		s.owned.Close()
	}
	return nil
}

// Ping checks that the database answers and the table exists.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.db.Exec(ctx, "SELECT 1 FROM "+s.table+" LIMIT 1")
	return s.translate("ping", "", err)
}

// translate maps pgx errors at the store boundary: everything is
// "unavailable" (the call fails closed), with a hint for a missing table,
// but a role without a privilege ([*PrivilegeError]) and a connection
// refused for good ([*ConnectError]: password, role, database).
func (s *Store) translate(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if ce := connectRefused(err); ce != nil {
		return ce
	}
	if insufficientPrivilege(err) {
		var pe *pgconn.PgError
		errors.As(err, &pe)
		return &PrivilegeError{Table: s.cfg.Table, Err: pe}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return &NoTableError{Op: op, Key: key, Table: s.cfg.Table, Err: err}
	}
	if errors.As(err, &pe) && (pe.Code == "22021" || pe.Code == "22P05") {
		// Text the server refuses (not UTF-8, a NUL byte): retrying the
		// same write cannot succeed.
		return fmt.Errorf("pgstore: %s %s: the server refuses the write's text: %w: %w", op, key, store.ErrInvalidParams, err)
	}
	if errors.As(err, &pe) && pe.Code == "53300" {
		return fmt.Errorf("pgstore: %s %s: the server is out of connections for the store (raise max_connections or the role's CONNECTION LIMIT above the sum of every pool, or lower pool_max_conns): %w: %w",
			op, key, store.ErrUnavailable, err)
	}
	return fmt.Errorf("pgstore: %s %s: %w: %w", op, key, store.ErrUnavailable, err)
}

const columns = "key, status, fence, owner, lease_until, expires_at, fingerprint, result, err_code, err_message, err_body, ref, created_at, completed_at, version, takeover, hold, steps"

type statements struct {
	claim, upsert, complete, fail, release, extend, explain, get, del, reap string
	step, explainStep                                                       string
}

func newStatements(t string) statements {
	// fenced builds a fenced write on a row in status $5 (the write's
	// From): a plain statement, whose refusal is explained by a second
	// one (explain) only when it happens. Complete and Fail clear the
	// other outcome, which a settled row corrected by its claim still
	// holds; Extend keeps the lease when $6 is 0 and the ref when $7 is
	// empty.
	fenced := func(write string) string {
		return write + " WHERE key = $1 AND fence = $2 AND owner = $3 AND status = $5 AND expires_at > $4"
	}
	return statements{
		// A conflict takes no row lock, so a duplicate writes nothing and
		// costs no commit flush. The existing row is read from the
		// statement's snapshot.
		claim: "WITH ins AS (INSERT INTO " + t + " (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version, takeover, hold) " +
			"VALUES ($1, 1, 1, $2, $3, $4, $5, $6, $7, false, $8) ON CONFLICT (key) DO NOTHING RETURNING " + columns + ") " +
			"SELECT true, " + columns + " FROM ins UNION ALL " +
			"SELECT false, " + columns + " FROM " + t + " WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)",
		upsert:   claimUpsert(t),
		complete: fenced("UPDATE " + t + " SET status = 2, result = $7, err_code = NULL, err_message = NULL, err_body = NULL, steps = NULL, expires_at = $6, completed_at = $4"),
		fail:     fenced("UPDATE " + t + " SET status = 3, err_code = $7, err_message = $8, err_body = $9, result = NULL, steps = NULL, expires_at = $6, completed_at = $4"),
		// A step ($7, of size $8) is appended when the row holds $6
		// steps and the steps with it stay within $9 bytes.
		step: fenced("UPDATE "+t+" SET steps = COALESCE(steps, '[]'::jsonb) || jsonb_build_array($7::jsonb)") +
			" AND COALESCE(jsonb_array_length(steps), 0) = $6 AND " + stepsSize + " + $8 <= $9",
		explainStep: "SELECT fence, owner, status, expires_at, COALESCE(jsonb_array_length(steps), 0), steps->($2::int)->>'name', " + stepsSize + " FROM " + t + " WHERE key = $1",
		release:     fenced("DELETE FROM " + t),
		extend:      fenced("UPDATE " + t + " SET lease_until = COALESCE(NULLIF($6::bigint, 0), lease_until), ref = COALESCE(NULLIF($7::text, ''), ref)"),
		explain:     "SELECT fence, owner, status, expires_at FROM " + t + " WHERE key = $1",
		get:         "SELECT " + columns + " FROM " + t + " WHERE key = $1",
		del:         "DELETE FROM " + t + " WHERE key = $1",
		reap:        "DELETE FROM " + t + " WHERE key IN (SELECT key FROM " + t + " WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
	}
}

// stepsSize is the size of a row's steps (store.Step.Size, summed).
const stepsSize = "COALESCE((SELECT sum((e->>'size')::bigint) FROM jsonb_array_elements(steps) e), 0)"

// carried is the steps column of a claimable row claimed at now with
// fingerprint fp: the row's steps when the claim takes it over (it has
// not expired) with its own fingerprint, else none.
func carried(now, fp string) string {
	return "CASE WHEN cur.expires_at > " + now + " AND cur.fingerprint = " + fp + " THEN cur.steps END"
}

// claimUpsert builds the claim's last statement. ON CONFLICT DO UPDATE
// either inserts or locks the conflicting row and updates its newest
// committed version, even one the statement's snapshot cannot see; that
// is PostgreSQL's guarantee for this clause in READ COMMITTED, and what
// the first statement (DO NOTHING, reading its snapshot) lacks. Every
// column is set from a CASE on one condition, the record's claimability
// at $6 (the rule of [store.ApplyClaim]: a held row, column hold, is not
// claimable past its lease; with $9, ClaimParams.NoTakeover, an
// IN_PROGRESS row is never claimable; $8 is ClaimParams.Hold), evaluated on the locked version:
// when claimable, a new claim with fence + 1; otherwise the row's own
// value, so no field changes (the row gets a new version with the same
// values) and RETURNING still gives the row.
//
// Its first column says whether the caller holds the claim: IN_PROGRESS
// with the caller's owner and fingerprint. That is exactly the claim
// just written, or a row that was not claimable and that ApplyClaim
// would answer as acquired (the same owner's retried claim).
func claimUpsert(t string) string {
	claimable := "((cur.status <> 1 OR NOT $9::boolean) AND (cur.expires_at <= $6 OR (cur.status = 1 AND NOT cur.hold AND cur.lease_until <= $6)))"
	set := ""
	for _, c := range []struct{ col, claimed string }{
		{"status", "1"}, {"fence", "cur.fence + 1"}, {"owner", "$2"}, {"lease_until", "$3"}, {"expires_at", "$4"},
		{"fingerprint", "$5"}, {"result", "NULL"}, {"err_code", "NULL"}, {"err_message", "NULL"}, {"err_body", "NULL"},
		{"ref", "NULL"}, {"created_at", "$6"}, {"completed_at", "NULL"}, {"version", "$7"},
		{"takeover", "cur.expires_at > $6"}, {"hold", "$8"}, {"steps", carried("$6", "$5")},
	} {
		if set != "" {
			set += ", "
		}
		set += c.col + " = CASE WHEN " + claimable + " THEN " + c.claimed + " ELSE cur." + c.col + " END"
	}
	return "INSERT INTO " + t + " AS cur (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version, takeover, hold) " +
		"VALUES ($1, 1, 1, $2, $3, $4, $5, $6, $7, false, $8) ON CONFLICT (key) DO UPDATE SET " + set +
		" RETURNING (cur.status = 1 AND cur.owner = $2 AND cur.fingerprint = $5), " + columns
}

// Claim implements [store.Store]. It sends at most three statements and
// never loops on what it reads, so contention cannot exhaust it: the
// last statement always decides.
//
// The first, INSERT … ON CONFLICT DO NOTHING, inserts a new claim, or
// returns the conflicting row as of its snapshot without locking or
// writing it. When that row is live and not claimable, the answer (a
// conflict, or the same owner's retry) was true when the snapshot was
// taken, within the call: a duplicate is one statement and writes
// nothing. Two cases cannot be decided from the snapshot:
//
//   - The conflicting row is not in the snapshot: the transaction that
//     inserted it committed after the statement began (the INSERT waited
//     for it). The statement is sent once more; its new snapshot is taken
//     after that commit, so it sees the row unless the row was deleted
//     since. That is the common race of duplicates, and they still write
//     nothing.
//   - The row is claimable in the snapshot, but a concurrent claim may
//     already have replaced it. A write conditional on the fence read
//     would then change nothing, and reading again and retrying can lose
//     the same way every round under contention: each read is outdated
//     by the next takeover before the write arrives.
//
// Either way (or when the row is missing from the second snapshot too),
// the last statement is the upsert of claimUpsert, which decides on the
// row's newest version under its lock. A retried claim answered by the
// upsert reports as Takeover how it was first acquired.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	args := []any{p.Key, p.Owner, p.LeaseUntil, p.ExpiresAt, p.Fingerprint, p.Now, store.RecordVersion, p.Hold}
	for range 2 {
		rec, inserted, err := s.claimInsert(ctx, args)
		if err != nil {
			return store.ClaimResult{}, err
		}
		if inserted {
			// The row is the new claim as sent: built here, not decoded.
			res, _ := store.ApplyClaim(nil, p)
			return res, nil
		}
		if rec != nil {
			if res, write := store.ApplyClaim(rec, p); write == nil {
				return res, nil
			}
			break
		}
	}
	rec, acquired, takeover, err := s.claimRow(ctx, append(args, p.NoTakeover))
	if err != nil {
		return store.ClaimResult{}, err
	}
	if rec == nil {
		// Not an outcome of INSERT … ON CONFLICT DO UPDATE without a
		// WHERE, which inserts or updates exactly one row.
		return store.ClaimResult{}, fmt.Errorf("pgstore: claim %s: the upsert returned no row: %w", p.Key, store.ErrUnavailable)
	}
	if !acquired {
		return store.ClaimResult{Record: rec}, nil
	}
	return store.ClaimResult{Acquired: true, Takeover: takeover, Record: rec}, nil
}

// claimInsert runs the claim's first statement: inserted, or the row it
// met (nil when it returned none).
func (s *Store) claimInsert(ctx context.Context, args []any) (rec *store.Record, inserted bool, err error) {
	rows, err := s.db.Query(ctx, s.sql.claim, args...)
	if err != nil {
		return nil, false, s.translate("claim", args[0].(string), err)
	}
	if rows.Next() {
		// The first column says which branch answered; an inserted row
		// is not decoded (nil skips a column).
		skip := make([]any, 19)
		skip[0] = &inserted
		if err = rows.Scan(skip...); err == nil && !inserted {
			rec, _, err = scanRecord(rows, &inserted)
		}
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	var ce *store.CorruptError
	if errors.As(err, &ce) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, s.translate("claim", args[0].(string), err)
	}
	return rec, inserted, nil
}

// claimRow runs the upsert statement: nil when it returned no row.
func (s *Store) claimRow(ctx context.Context, args []any) (rec *store.Record, acquired, takeover bool, err error) {
	rows, err := s.db.Query(ctx, s.sql.upsert, args...)
	if err != nil {
		return nil, false, false, s.translate("claim", args[0].(string), err)
	}
	if rows.Next() {
		rec, takeover, err = scanRecord(rows, &acquired)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	var ce *store.CorruptError
	if errors.As(err, &ce) {
		return nil, false, false, err
	}
	if err != nil {
		return nil, false, false, s.translate("claim", args[0].(string), err)
	}
	return rec, acquired, takeover, nil
}

// scanRecord reads one row of `columns`, preceded by a boolean when
// first is not nil.
func scanRecord(row pgx.Row, first *bool) (*store.Record, bool, error) {
	var (
		r                    store.Record
		status               int16
		fence                int64
		errCode, errMsg, ref *string
		completed            *int64
		result, errBody      []byte
		steps                []byte
		version              int32
		takeover             bool
		dest                 []any
	)
	if first != nil {
		dest = append(dest, first)
	}
	dest = append(dest, &r.Key, &status, &fence, &r.Owner, &r.LeaseUntil, &r.ExpiresAt, &r.Fingerprint, &result,
		&errCode, &errMsg, &errBody, &ref, &r.CreatedAt, &completed, &version, &takeover, &r.Hold, &steps)
	if err := row.Scan(dest...); err != nil {
		return nil, false, err
	}
	r.Status, r.Fence, r.Version = store.Status(status), uint64(fence), int(version)
	if !r.Status.Valid() || version != store.RecordVersion {
		return nil, false, &store.CorruptError{Key: r.Key, Reason: fmt.Sprintf("row has status %d, version %d", status, version)}
	}
	if completed != nil {
		r.CompletedAt = *completed
	}
	if ref != nil {
		r.Ref = *ref
	}
	if steps != nil {
		var err error
		if r.Steps, err = decodeSteps(r.Key, steps); err != nil {
			return nil, false, err
		}
	}
	switch r.Status {
	case store.StatusCompleted:
		if result == nil {
			return nil, false, &store.CorruptError{Key: r.Key, Reason: "COMPLETED row without a result"}
		}
		r.Result = result
	case store.StatusFailed:
		r.Err = &store.ErrorRecord{Body: errBody}
		if errCode != nil {
			r.Err.Code = *errCode
		}
		if errMsg != nil {
			r.Err.Message = *errMsg
		}
		if len(r.Err.Body) == 0 {
			r.Err.Body = nil
		}
	}
	return &r, takeover, nil
}

// fenced runs a fenced statement on a row in status from (IN_PROGRESS
// when zero) and explains a refusal.
func (s *Store) fenced(ctx context.Context, db DB, op, sql string, c store.ClaimRef, args ...any) error {
	// The write is one plain statement, the common case; only a refusal
	// costs a second one, which reads the row to explain it. The write
	// waits for the row's lock and re-checks its newest version, but it
	// cannot see a row inserted after its snapshot, and the read comes
	// later still: an explanation that shows a row the write matches is
	// out of date (the claim changed between the write and the read) and
	// the write runs again. A claim's (fence, owner) never matches again
	// once it stopped matching (owners are unique per claim), and only the
	// claim's own writes change its row's status, so one more round
	// decides; the bound is a guard against those writes moving the row
	// back to from in between.
	from := c.From.OrInProgress()
	args = append([]any{c.Key, int64(c.Fence), c.Owner, c.Now, int16(from)}, args...)
	for round := 0; ; round++ {
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return s.translate(op, c.Key, err)
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var (
			curFence, expires int64
			curOwner          string
			status            int16
		)
		err = db.QueryRow(ctx, s.sql.explain, c.Key).Scan(&curFence, &curOwner, &status, &expires)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return s.translate(op, c.Key, err)
		}
		if expires <= c.Now {
			return store.ErrNotFound
		}
		fe := c.Fenced(uint64(curFence), curOwner, store.Status(status))
		if !fe.Own() || fe.Status != from || round == 2 {
			return fe
		}
	}
}

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.complete(ctx, s.db, p)
}

// CompleteTx is Complete inside the caller's transaction: the record
// becomes COMPLETED when, and only if, tx commits. A refusal (fenced, not
// found) should make the caller roll tx back.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p store.CompleteParams) error {
	return s.complete(ctx, tx, p)
}

// CompleteInTx runs fn in a transaction begun on the store's DB and
// completes the record, in that same transaction, with the parameters fn
// returns, then commits: fn's writes and the COMPLETED record commit
// together or not at all. key names the record in errors.
//
//   - fn's error, or a panic: the transaction rolls back and fn's error
//     is returned as it is (the panic goes on).
//   - the completion is refused (the claim was lost: a [*store.FencedError]
//     or [store.ErrNotFound]; a result over the limit): the transaction
//     rolls back and the refusal is returned; fn's writes never become
//     visible.
//   - begin or commit fails: an error translated as the store's others
//     are (wrapping [store.ErrUnavailable]).
//
// It is the engine-free half of idempg.DoTx, which runs an operation and
// its idem record in one transaction.
func (s *Store) CompleteInTx(ctx context.Context, key string, fn func(ctx context.Context, tx pgx.Tx) (store.CompleteParams, error)) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return s.translate("begin", key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	p, err := fn(ctx, tx)
	if err != nil {
		return err
	}
	if err := s.complete(ctx, tx, p); err != nil {
		return err
	}
	return s.translate("commit", key, tx.Commit(ctx))
}

// WriteInTx runs fn in a transaction begun on the store's DB and commits
// it, with no record: the writes of an operation that an engine runs
// without a claim (idem's Config.Disabled, or FailOpen after a failed
// claim), which idempg.DoTx still makes in a transaction. fn's error, or a
// panic, rolls it back (the error is returned as it is); a failed begin or
// commit is translated as the store's other errors are. key names the call
// in errors.
func (s *Store) WriteInTx(ctx context.Context, key string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return s.translate("begin", key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return s.translate("commit", key, tx.Commit(ctx))
}

func (s *Store) complete(ctx context.Context, db DB, p store.CompleteParams) error {
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	result := p.Result
	if result == nil {
		result = []byte{}
	}
	return s.fenced(ctx, db, "complete", s.sql.complete, p.ClaimRef, p.ExpiresAt, result)
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, s.db, "fail", s.sql.fail, p.ClaimRef, p.ExpiresAt, p.Err.Code, p.Err.Message, p.Err.Body)
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, s.db, "release", s.sql.release, p.ClaimRef)
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	return s.fenced(ctx, s.db, "extend", s.sql.extend, p.ClaimRef, p.LeaseUntil, p.Ref)
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	r, _, err := scanRecord(s.db.QueryRow(ctx, s.sql.get, key), nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	var ce *store.CorruptError
	if errors.As(err, &ce) {
		return nil, err
	}
	if err != nil {
		return nil, s.translate("get", key, err)
	}
	return r, nil
}

// Delete implements [store.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	tag, err := s.db.Exec(ctx, s.sql.del, key)
	if err != nil {
		return s.translate("delete", key, err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }
