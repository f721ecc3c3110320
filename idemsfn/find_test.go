package idemsfn_test

import (
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/store"
)

// An operator who has the key a caller started an execution with — the
// Request's Key, or without one its payload — finds the record in the
// console from that alone (clientkey.Key and clientkey.JSON, the engine's
// own derivation, which idemctl find -message and -json use too); it is
// the key the execution's input carries as $.idem.key.
func TestLocalRecordIsFoundFromTheStartKey(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{})
		if _, err := l.s.Start(ctx, req("o-42"), map[string]int{"amount": 5}); err != nil {
			t.Fatal(err)
		}
		found := consoletest.FindIn(t, l.fs, clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Key: "o-42"})
		if tk := next(t, l.tasks); tk.env.Idem.Key != found {
			t.Fatalf("the execution's input carries %s; found %s", tk.env.Idem.Key, found)
		}
		payload := `{"order": "o-43", "amount": 7}`
		if _, err := l.s.Start(ctx, idem.Request{Payload: []byte(payload)}, nil); err != nil {
			t.Fatal(err)
		}
		found = consoletest.FindIn(t, l.fs, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: payload})
		if tk := next(t, l.tasks); tk.env.Idem.Key != found {
			t.Fatalf("the execution's input carries %s; found %s", tk.env.Idem.Key, found)
		}
	})
}
