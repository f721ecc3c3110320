package ordertest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Backend is a store the module's tests run every behaviour on.
type Backend struct {
	Name  string
	Store func(t testing.TB) store.Store
}

// Backends are those stores: in process, and a real Redis at the address
// redisAddr finds (the tests pass testenv.Reach: skipped outside CI when
// none answers, failing in CI; a production package imports no test kit).
func Backends(redisAddr func(testing.TB) string) []Backend {
	return []Backend{
		{"memstore", func(t testing.TB) store.Store {
			s := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(t testing.TB) store.Store {
			return RedisStore(t, redisAddr(t))
		}},
	}
}

// RedisStore returns a store on the Redis at addr, under a key prefix of
// its own.
func RedisStore(t testing.TB, addr string) store.Store {
	t.Helper()
	return RedisStoreAt(t, addr, fmt.Sprintf("idemgrpc-test-%d:", rand.Uint64()))
}

// RedisStoreAt returns a store on the Redis at addr under prefix: stores
// made with the same prefix, in one process or several, share their keys.
func RedisStoreAt(t testing.TB, addr, prefix string) store.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
