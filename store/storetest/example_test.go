package storetest_test

import (
	"testing"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// A store author runs the whole contract from a test in the store's
// package, with a constructor that gives every case an isolated store and
// registers its cleanup. Here memstore stands in for the store under test;
// a store with a server would make a fresh table, schema or key prefix
// instead. The function is a test, so it runs under go test, not here.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20}, func(t *testing.T) store.Store {
			s := memstore.New(&memstore.Config{MaxResultBytes: 1 << 20})
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	}
	_ = testConformance // in the store's package: func TestConformance(t *testing.T) { ... }
}
