package boltstore_test

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// Reproduce: cd store/boltstore && go test -run '^$' -bench . -benchmem -benchtime 3s
// Every write but a Do's claim is fsynced (group-committed); the file is on
// the machine's disk. cpu-µs/op is the process's CPU time (user + system)
// per call, which does not depend on other load the way ops/s does.

func benchStore(b *testing.B, cfg *boltstore.Config) (*boltstore.Store, *idem.Engine) {
	b.Helper()
	c := boltstore.Config{SweepInterval: -1}
	if cfg != nil {
		c = *cfg
		c.SweepInterval = -1
	}
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "idem.db"), &c)
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

// cpuTime returns the process's user + system CPU time in µs.
func cpuTime() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	us := func(t syscall.Timeval) float64 { return float64(t.Sec)*1e6 + float64(t.Usec) }
	return us(ru.Utime) + us(ru.Stime)
}

// measured runs fn (one benchkit run) and reports CPU per op.
func measured(b *testing.B, fn func()) {
	t0 := cpuTime()
	fn()
	b.ReportMetric((cpuTime()-t0)/float64(b.N), "cpu-µs/op")
}

// BenchmarkNewCall: "default" holds a Do's claim in memory and appends it
// to the claim journal (unsynced); "synced" is Config.SyncEveryClaim (every
// claim written and synced).
func BenchmarkNewCall(b *testing.B) {
	for _, mode := range []string{"default", "synced"} {
		for _, c := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/c=%d", mode, c), func(b *testing.B) {
				s, e := benchStore(b, &boltstore.Config{SyncEveryClaim: mode == "synced"})
				measured(b, func() { benchkit.NewCalls(b, e, c) })
				commits, writes := s.CommitStats()
				b.ReportMetric(float64(writes)/float64(commits), "writes/commit")
			})
		}
	}
}

func BenchmarkDuplicateCall(b *testing.B) {
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			_, e := benchStore(b, nil)
			measured(b, func() { benchkit.DuplicateCalls(b, e, c, 1000) })
		})
	}
}

// BenchmarkRaw is the same bbolt client doing raw operations with no
// library and no engine, keys and records the size the library writes:
//   - new/2batch: what a new call cost before Do's claims were kept in
//     memory, and what a bbolt user would write: a read-and-put in one
//     DB.Batch (claim) and a put in another (complete), bbolt's own
//     options (MaxBatchDelay 500µs).
//   - new/1put: the floor of the store's design: one put per call, group
//     committed the way the store does it (back to back, no delay), with
//     the store's bbolt options.
//   - dup: one read-only transaction.
func BenchmarkRaw(b *testing.B) {
	key := func(i int) []byte {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return []byte(k.String())
	}
	rec := store.MarshalRecord(&store.Record{Key: string(key(0)), Status: store.StatusCompleted, Fence: 1, Owner: "host/12345/0a1b2c3d/123456",
		Result: []byte(`{"id":"r-1","amount":1000}`), LeaseUntil: 1 << 41, ExpiresAt: 1 << 41, CreatedAt: 1 << 41, CompletedAt: 1 << 41, Version: 1})
	for _, c := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("new/2batch/c=%d", c), func(b *testing.B) {
			db := rawDB(b, nil)
			db.MaxBatchDelay = 500e3 // 500µs
			measured(b, func() {
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
		})
		b.Run(fmt.Sprintf("new/1put/c=%d", c), func(b *testing.B) {
			db := rawDB(b, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
			g := boltstore.NewGroupCommit(db)
			b.Cleanup(g.Close)
			measured(b, func() {
				benchkit.Run(b, c, func(i int) error {
					k := key(i)
					return g.Do(func(tx *bolt.Tx) error { return tx.Bucket([]byte("idem")).Put(k, rec) })
				})
			})
		})
	}
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", c), func(b *testing.B) {
			db := rawDB(b, nil)
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
			measured(b, func() {
				benchkit.Run(b, c, func(i int) error {
					return db.View(func(tx *bolt.Tx) error {
						v := tx.Bucket([]byte("idem")).Get(key(i % 1000))
						_ = append([]byte(nil), v...)
						return nil
					})
				})
			})
		})
	}
}

func rawDB(b *testing.B, o *bolt.Options) *bolt.DB {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("idem")); return err }); err != nil {
		b.Fatal(err)
	}
	return db
}

// BenchmarkCommit is the cost model of one bbolt commit of n random-key
// puts into a file of 40,000 records, with bbolt's defaults and with the
// store's options (NoFreelistSync, map freelist): ns/op is one commit.
func BenchmarkCommit(b *testing.B) {
	key := func(i int) []byte {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return []byte(k.String())
	}
	rec := store.MarshalRecord(&store.Record{Key: string(key(0)), Status: store.StatusCompleted, Fence: 1, Owner: "host/12345/0a1b2c3d/123456",
		Result: []byte(`{"id":"r-1","amount":1000}`), LeaseUntil: 1 << 41, ExpiresAt: 1 << 41, CreatedAt: 1 << 41, CompletedAt: 1 << 41, Version: 1})
	for _, o := range []struct {
		name string
		opts *bolt.Options
	}{{"defaults", nil}, {"store", &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType}}} {
		for _, n := range []int{1, 32, 64, 128} {
			b.Run(fmt.Sprintf("%s/puts=%d", o.name, n), func(b *testing.B) {
				db := rawDB(b, o.opts)
				next := 0
				put := func(n int) {
					if err := db.Update(func(tx *bolt.Tx) error {
						for range n {
							if err := tx.Bucket([]byte("idem")).Put(key(next), rec); err != nil {
								return err
							}
							next++
						}
						return nil
					}); err != nil {
						b.Fatal(err)
					}
				}
				for range 40 {
					put(1000)
				}
				b.ResetTimer()
				measured(b, func() {
					for range b.N {
						put(n)
					}
				})
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/put")
			})
		}
	}
}
