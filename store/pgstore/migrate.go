package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/seed-a1b882c0/idem/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string // with the table name filled in
}

// Migrations returns the schema steps for table, in order.
func Migrations(table string) ([]Migration, error) {
	quoted, err := quoteTable(table)
	if err != nil {
		return nil, err
	}
	base := table
	if i := strings.LastIndexByte(base, '.'); i >= 0 {
		base = base[i+1:]
	}
	data := struct{ Table string }{quoted}
	funcs := template.FuncMap{"index_name": func(name string) string { return pgx.Identifier{base + "_" + name}.Sanitize() }}
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []Migration
	for _, n := range names {
		file := strings.TrimPrefix(n, "migrations/")
		num, _, ok := strings.Cut(file, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pgstore: migration %s is not named NNNN_name.sql", file)
		}
		src, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(file).Funcs(funcs).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: %w", file, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("pgstore: migration %s: %w", file, err)
		}
		out = append(out, Migration{Version: v, Name: file, SQL: b.String()})
	}
	return out, nil
}

// Migrate applies the migrations of table that db has not applied yet,
// each in its own transaction, recording them in idem_schema_migrations
// (created in the table's schema). Concurrent callers, of one table or of
// several tables of one schema, are serialised by a transaction-scoped
// advisory lock (pg_advisory_xact_lock) on that schema's migrations table,
// taken before anything else in each migration's transaction, so every
// process may call it at start.
func Migrate(ctx context.Context, db DB, table string) error {
	ms, err := Migrations(table)
	if err != nil {
		return err
	}
	schema := ""
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema = table[:i]
	}
	track, err := quoteTable(strings.TrimPrefix(schema+".idem_schema_migrations", "."))
	if err != nil {
		return err
	}
	// One lock per migrations table, not per records table: the first
	// migration of two tables of one schema both create
	// idem_schema_migrations, and two concurrent CREATE TABLE IF NOT
	// EXISTS of one name fail (a unique violation on pg_type).
	h := fnv.New64a()
	h.Write([]byte("idem migrate " + track))
	lock := int64(h.Sum64())
	// A table whose migrations are all recorded needs no lock and no DDL:
	// a role with only the table's privileges (and SELECT on
	// idem_schema_migrations) opens it.
	done, err := applied(ctx, db, track, table)
	if err != nil {
		return migrateError(ctx, db, table, err)
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if err := applyOne(ctx, db, track, table, lock, m); err != nil {
			return migrateError(ctx, db, table, err)
		}
	}
	return nil
}

// applied returns the versions recorded for table; none when the
// migrations table does not exist yet.
func applied(ctx context.Context, db DB, track, table string) (map[int]bool, error) {
	rows, err := db.Query(ctx, "SELECT version FROM "+track+" WHERE tbl = $1", table)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") { // no such table, no such schema
			return nil, nil
		}
		return nil, fmt.Errorf("pgstore: migrate %s: %w: %w", table, store.ErrUnavailable, err)
	}
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: migrate %s: %w: %w", table, store.ErrUnavailable, err)
		}
		done[v] = true
	}
	if err := rows.Err(); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
			return nil, nil
		}
		return nil, fmt.Errorf("pgstore: migrate %s: %w: %w", table, store.ErrUnavailable, err)
	}
	return done, nil
}

// migrateError makes a refusal for lack of privileges a *PrivilegeError,
// and a connection refused for good a *ConnectError.
func migrateError(ctx context.Context, db DB, table string, err error) error {
	if ce := connectRefused(err); ce != nil {
		return ce
	}
	if !insufficientPrivilege(err) {
		return err
	}
	var role string
	_ = db.QueryRow(ctx, "SELECT current_user").Scan(&role) // best effort, for the message
	var pe *pgconn.PgError
	errors.As(err, &pe) // the server's refusal alone: not store.ErrUnavailable
	return &PrivilegeError{Role: role, Table: table, Migrating: true, Err: pe}
}

func applyOne(ctx context.Context, db DB, track, table string, lock int64, m Migration) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w: %w", table, store.ErrUnavailable, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	steps := []string{
		"SELECT pg_advisory_xact_lock(" + strconv.FormatInt(lock, 10) + ")",
		"CREATE TABLE IF NOT EXISTS " + track + " (tbl text NOT NULL, version integer NOT NULL, name text NOT NULL, " +
			"applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tbl, version))",
	}
	for _, q := range steps {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgstore: migrate %s: %w", table, err)
		}
	}
	var done bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+track+" WHERE tbl = $1 AND version = $2)", table, m.Version).Scan(&done); err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", table, err)
	}
	if done {
		return nil
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return fmt.Errorf("pgstore: migration %s on %s: %w", m.Name, table, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+track+" (tbl, version, name) VALUES ($1, $2, $3)", table, m.Version, m.Name); err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", table, err)
	}
	return nil
}

// quoteTable quotes a table name, "name" or "schema.name".
func quoteTable(t string) (string, error) {
	parts := strings.Split(t, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("pgstore: table name %q has more than schema.name: %w", t, store.ErrInvalidConfig)
	}
	for _, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) {
			return "", fmt.Errorf("pgstore: table name %q has an empty or invalid part: %w", t, store.ErrInvalidConfig)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}
