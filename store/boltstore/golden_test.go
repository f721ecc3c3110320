package boltstore_test

import (
	"context"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// TestGoldenLayout: the bytes bbolt holds for each golden record, made
// through the store's operations, are those of testdata/golden; and a file
// holding those bytes reads back as the golden records. A change of the
// layout fails it.
func TestGoldenLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := boltstore.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	golden := storetest.GoldenRecords()
	for _, g := range golden {
		storetest.MakeGolden(t, s, g)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw := map[string][]byte{}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		for _, g := range golden {
			raw[g.Name] = append([]byte(nil), tx.Bucket([]byte("idem")).Get([]byte(g.Record.Key))...)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// A file written by this release's layout, read by the store.
	path = filepath.Join(t.TempDir(), "golden.db")
	if db, err = bolt.Open(path, 0o600, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("idem"))
		for _, g := range golden {
			if err == nil {
				err = b.Put([]byte(g.Record.Key), storetest.GoldenFile(t, filepath.Join("testdata", "golden", g.Name+".bolt"), raw[g.Name]))
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = boltstore.Open(path, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, g := range golden {
		got, err := s.Get(ctx, g.Record.Key)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		storetest.CheckGolden(t, g, got)
	}
}
