package pgstore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// TestGoldenLayout: the row PostgreSQL holds for each golden record, made
// through the store's operations, is that of testdata/golden (every
// column, as row_to_json writes it); and a row of those columns reads back
// as the golden record. A change of the layout (a column added, renamed or
// written otherwise) fails it; a change made on purpose comes with a
// numbered migration.
func TestGoldenLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStore(t, pgstore.Config{})
	other, _ := newStore(t, pgstore.Config{})
	for _, g := range storetest.GoldenRecords() {
		storetest.MakeGolden(t, s, g)
		var row string
		if err := pool.QueryRow(ctx, "SELECT row_to_json(r)::text FROM "+s.Config().Table+" r WHERE key = $1", g.Record.Key).Scan(&row); err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		b := storetest.GoldenFile(t, filepath.Join("testdata", "golden", g.Name+".json"), []byte(row+"\n"))
		tbl := other.Config().Table
		if _, err := pool.Exec(ctx, "INSERT INTO "+tbl+" SELECT * FROM json_populate_record(NULL::"+tbl+", $1::json)", string(b)); err != nil {
			t.Fatalf("%s: insert the golden row: %v", g.Name, err)
		}
		got, err := other.Get(ctx, g.Record.Key)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		storetest.CheckGolden(t, g, got)
	}
}
