package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Reproduce: cd store/redisstore && go test -run '^$' -bench . -benchmem -benchtime 2s -count 3
// Redis 7 on loopback, no persistence (the machine's service).

func benchClient(b *testing.B) *redis.Client {
	return newClient(b, addr(b), func(o *redis.Options) { o.PoolSize = 32; o.ReadTimeout = 0; o.WriteTimeout = 0 })
}

func benchStore(b *testing.B) store.Store {
	c := benchClient(b)
	s, err := redisstore.New(c, &redisstore.Config{Prefix: newPrefix(b, c)})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func BenchmarkNewCall(b *testing.B) { benchkit.NewCallBenchmarks(b, benchStore, 1, 16) }

func BenchmarkDuplicateCall(b *testing.B) {
	benchkit.DuplicateCallBenchmarks(b, benchStore, 1000, 1, 16)
}

// BenchmarkRaw is the same client with no library: a new call is SET NX
// (the claim) and SET (the result); a duplicate is the SET NX failing and
// a GET of the stored value — what a hand-written idempotency check needs
// to answer a duplicate. Keys and values are the library's sizes.
func BenchmarkRaw(b *testing.B) {
	key := func(p string, i int) string {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return p + k.String()
	}
	val := []byte(`{"id":"r-1","amount":1000}`)
	ctx := context.Background()
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("new/c=%d", conc), func(b *testing.B) {
			c := benchClient(b)
			p := newPrefix(b, c)
			benchkit.Run(b, conc, func(i int) error {
				k := key(p, i)
				ok, err := c.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
				if err != nil || !ok {
					return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
				}
				return c.Set(ctx, k, val, 0).Err()
			})
		})
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", conc), func(b *testing.B) {
			c := benchClient(b)
			p := newPrefix(b, c)
			for i := range 1000 {
				c.Set(ctx, key(p, i), val, 0)
			}
			benchkit.Run(b, conc, func(i int) error {
				k := key(p, i%1000)
				ok, err := c.SetNX(ctx, k, "IN_PROGRESS", 0).Result()
				if err != nil || ok {
					return fmt.Errorf("SET NX %s: %v %v", k, ok, err)
				}
				return c.Get(ctx, k).Err()
			})
		})
	}
}
