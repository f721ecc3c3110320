package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// freshSchema creates an empty schema, dropped when t ends: no records
// table and no idem_schema_migrations yet.
func freshSchema(t *testing.T, pool *pgxpool.Pool) string {
	schema := fmt.Sprintf("idemfresh_%d_%x", schemaSeq.Add(1), rand.Uint32())
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// TestThreeProcessesMigrateAFreshSchemaAtOnce is three processes starting
// at once on a fresh schema — each with its own pool, as separate gateways
// or services have — migrating the same table, then three different tables
// of the schema: every Migrate succeeds and each migration is applied and
// recorded once. (Without one advisory lock per schema, the concurrent
// CREATE TABLE IF NOT EXISTS idem_schema_migrations of different tables
// fails with a unique violation on pg_type.)
func TestThreeProcessesMigrateAFreshSchemaAtOnce(t *testing.T) {
	addr := hostPort(t)
	admin := newPoolTimeout(t, addr, 2, 10*time.Second)
	var pools []*pgxpool.Pool
	for range 3 {
		pools = append(pools, newPoolTimeout(t, addr, 2, 10*time.Second))
	}
	ms, err := pgstore.Migrations("x")
	if err != nil {
		t.Fatal(err)
	}
	for _, same := range []bool{true, false} {
		schema := freshSchema(t, admin)
		tables := []string{schema + ".records", schema + ".records", schema + ".records"}
		if !same {
			tables = []string{schema + ".a", schema + ".b", schema + ".c"}
		}
		start := make(chan struct{})
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i, p := range pools {
			wg.Go(func() {
				<-start
				errs[i] = pgstore.Migrate(context.Background(), p, tables[i])
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("same table %v: migrate %d of %s: %v", same, i, tables[i], err)
			}
		}
		for _, tbl := range tables {
			var n int
			if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".idem_schema_migrations WHERE tbl = $1", tbl).Scan(&n); err != nil || n != len(ms) {
				t.Fatalf("%s: %d migrations recorded (%v), want %d", tbl, n, err, len(ms))
			}
			if _, err := admin.Exec(context.Background(), "SELECT 1 FROM "+tbl+" LIMIT 1"); err != nil {
				t.Fatalf("%s: %v", tbl, err)
			}
		}
	}
}

// TestARoleWithoutRightsIsFoundAtOpen opens a migrated table as a role
// created for the test: with no grant at all, Open fails while migrating;
// with USAGE on the schema and SELECT on the migrations table and the
// records table only, Check names INSERT, UPDATE and DELETE; with those
// granted, Open succeeds without any DDL right. Each failure is a
// *PrivilegeError matching idem.ErrInvalidConfig and store.ErrMisconfigured,
// with the GRANT to run.
func TestARoleWithoutRightsIsFoundAtOpen(t *testing.T) {
	addr := hostPort(t)
	ctx := context.Background()
	admin := newPoolTimeout(t, addr, 2, 10*time.Second)
	schema := freshSchema(t, admin)
	table := schema + ".records"
	if err := pgstore.Migrate(ctx, admin, table); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("idem_norights_%x", rand.Uint32())
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the schema's drop: revoke, then drop the role
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := admin.Exec(context.Background(), q); err != nil {
				t.Errorf("cleanup: %s: %v", q, err)
			}
		}
	})
	url := fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=5", role, addr)
	open := func() error {
		s, err := pgstore.Open(ctx, url, &pgstore.Config{Table: table, ReapInterval: -1})
		if err == nil {
			s.Close()
		}
		return err
	}
	refused := func(step string, err error, want ...string) {
		t.Helper()
		var pe *pgstore.PrivilegeError
		if !errors.As(err, &pe) || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, store.ErrMisconfigured) || errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("%s: %v, want a *PrivilegeError", step, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", step, err, w)
			}
		}
		t.Logf("%s: %v", step, err)
	}

	refused("no grant", open(), "may not migrate", role, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+table+" TO "+role)
	for _, q := range []string{"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT SELECT ON " + schema + ".idem_schema_migrations TO " + role, "GRANT SELECT ON " + table + " TO " + role} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	err := open()
	refused("SELECT only", err, "lacks INSERT, UPDATE, DELETE on table "+table, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+table+" TO "+role)
	if pe := new(pgstore.PrivilegeError); errors.As(err, &pe) && (pe.Role != role || !slices.Equal(pe.Missing, []string{"INSERT", "UPDATE", "DELETE"})) {
		t.Errorf("SELECT only: %+v", pe)
	}
	if _, err := admin.Exec(ctx, "GRANT INSERT, UPDATE, DELETE ON "+table+" TO "+role); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Fatalf("with the grants: %v", err)
	}
}
