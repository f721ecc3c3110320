package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
