package boltstore_test

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// Reproduce: cd store/boltstore && go test -run '^$' -bench . -benchmem -benchtime 3s
// Every write is fsynced (group-committed); the file is on the machine's disk.

func benchStore(b *testing.B) (*boltstore.Store, *idem.Engine) {
	b.Helper()
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "idem.db"), &boltstore.Config{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	e, err := idem.New(s, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return s, e
}

func BenchmarkNewCall(b *testing.B) {
	for _, c := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			_, e := benchStore(b)
			benchkit.NewCalls(b, e, c)
		})
	}
}

func BenchmarkDuplicateCall(b *testing.B) {
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			_, e := benchStore(b)
			benchkit.DuplicateCalls(b, e, c, 1000)
		})
	}
}

// BenchmarkRaw is the same bbolt client doing the raw operations with no
// library: a new call is a batched read-and-put (claim) plus a batched put
// (complete); a duplicate is one read transaction.
func BenchmarkRaw(b *testing.B) {
	// Keys and values the size the library writes: "charge#<sha256 hex>" and
	// a full record.
	key := func(i int) []byte {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return []byte(k.String())
	}
	rec := store.MarshalRecord(&store.Record{Key: string(key(0)), Status: store.StatusCompleted, Fence: 1, Owner: "host/12345/0a1b2c3d/123456",
		Result: []byte(`{"id":"r-1","amount":1000}`), LeaseUntil: 1 << 41, ExpiresAt: 1 << 41, CreatedAt: 1 << 41, CompletedAt: 1 << 41, Version: 1})
	for _, c := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("new/c=%d", c), func(b *testing.B) {
			db := rawDB(b)
			benchkit.Run(b, c, func(i int) error {
				k := key(i)
				if err := db.Batch(func(tx *bolt.Tx) error {
					bk := tx.Bucket([]byte("idem"))
					if bk.Get(k) != nil {
						return nil
					}
					return bk.Put(k, rec)
				}); err != nil {
					return err
				}
				return db.Batch(func(tx *bolt.Tx) error { return tx.Bucket([]byte("idem")).Put(k, rec) })
			})
		})
	}
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", c), func(b *testing.B) {
			db := rawDB(b)
			if err := db.Update(func(tx *bolt.Tx) error {
				for i := range 1000 {
					if err := tx.Bucket([]byte("idem")).Put(key(i), rec); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			benchkit.Run(b, c, func(i int) error {
				return db.View(func(tx *bolt.Tx) error {
					v := tx.Bucket([]byte("idem")).Get(key(i % 1000))
					_ = append([]byte(nil), v...)
					return nil
				})
			})
		})
	}
}

func rawDB(b *testing.B) *bolt.DB {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	db.MaxBatchDelay = 500e3 // 500µs, as the store
	b.Cleanup(func() { _ = db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("idem")); return err }); err != nil {
		b.Fatal(err)
	}
	return db
}
