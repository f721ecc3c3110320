package pgstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// Reproduce: cd store/pgstore && go test -run '^$' -bench . -benchmem -benchtime 2s -count 3
// PostgreSQL 15 on loopback, the machine's service (fsync on, synchronous_commit on).

func benchStore(b *testing.B) store.Store {
	s, _ := newStore(b, pgstore.Config{})
	return s
}

func BenchmarkNewCall(b *testing.B) { benchkit.NewCallBenchmarks(b, benchStore, 1, 16) }

func BenchmarkDuplicateCall(b *testing.B) {
	benchkit.DuplicateCallBenchmarks(b, benchStore, 500, 1, 16)
}

// BenchmarkRaw is the same pool with no library, on the same table: a new
// call is INSERT … ON CONFLICT DO NOTHING plus an UPDATE storing the
// result; a duplicate is the INSERT doing nothing and a SELECT of the row
// (what a hand-written check needs to answer it).
func BenchmarkRaw(b *testing.B) {
	key := func(i int) string {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return k.String()
	}
	ins := func(t string) string {
		return "INSERT INTO " + t + " (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version) " +
			"VALUES ($1, 1, 1, 'o', 1, 9000000000000, '', 1, 1) ON CONFLICT (key) DO NOTHING"
	}
	val := []byte(`{"id":"r-1","amount":1000}`)
	ctx := context.Background()
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("new/c=%d", conc), func(b *testing.B) {
			s, pool := newStore(b, pgstore.Config{})
			t := s.Config().Table
			benchkit.Run(b, conc, func(i int) error {
				k := key(i)
				if _, err := pool.Exec(ctx, ins(t), k); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, "UPDATE "+t+" SET status = 2, result = $2, completed_at = 2 WHERE key = $1 AND fence = 1", k, val)
				return err
			})
		})
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", conc), func(b *testing.B) {
			s, pool := newStore(b, pgstore.Config{})
			t := s.Config().Table
			for i := range 500 {
				if _, err := pool.Exec(ctx, ins(t), key(i)); err != nil {
					b.Fatal(err)
				}
			}
			benchkit.Run(b, conc, func(i int) error {
				k := key(i % 500)
				if _, err := pool.Exec(ctx, ins(t), k); err != nil {
					return err
				}
				var st int
				return pool.QueryRow(ctx, "SELECT status FROM "+t+" WHERE key = $1", k).Scan(&st)
			})
		})
	}
}
