package consumetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/store"
)

// OpenStore opens the store that the processes of a scenario share (the
// test, a child consumer, idemctl) under a key prefix of its own, and
// returns it with the URL idemctl opens it by (prefix included). It is the
// adapter's: a store of the adapter's module, on its real server (Redis,
// in every consumer's tests). The store is closed at t's cleanup.
type OpenStore func(t testing.TB, prefix string) (s store.Store, url string)

// Deliver publishes messages to the adapter's broker and consumes them
// through the adapter with e, until each is settled as done, and returns,
// for each record made, what an operator has from its producer (the
// message id, the record key, the payload and topic).
type DeliverFind func(t *testing.T, e *idem.Engine) []clientkey.Material

// RecordIsFound is the find scenario: an operator who has what a
// producer sent finds the record a consumer made of it from that alone,
// in the console and with `idemctl find`, through clientkey, which every
// consumer keys its records with (a repocheck rule asks each adapter for
// this test). deliver makes the records with an engine (Lease 30s) over
// the store open gives, under a fresh prefix.
func RecordIsFound(t *testing.T, open OpenStore, deliver DeliverFind) {
	t.Helper()
	st, url := open(t, fmt.Sprintf("consumetest-find-%d:", rand.Uint64()))
	e, err := idem.New(st, &idem.Config{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	made := deliver(t, e)
	if len(made) == 0 {
		t.Fatal("consumetest: deliver made no record to find")
	}
	ctl := ctltest.Build(t)
	for _, m := range made {
		key := consoletest.FindIn(t, st, m)
		ctltest.Find(t, ctl, url, m, key)
	}
}
