package idemsfn_test

import (
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
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

// The same with idemctl, on a real Redis it opens by URL: `idemctl find
// -message` with the Start's key, `-json` with the payload of a Start
// without one.
func TestLocalRecordIsFoundByIdemctl(t *testing.T) {
	t.Parallel()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	prefix := unique("idemsfn-find:") + ":"
	st, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctl, url := ctltest.Build(t), "redis://"+addr+"/0?prefix="+prefix
	l := newLocalRig(t, func(testing.TB) store.Store { return st }, idemsfn.Config{})
	if _, err := l.s.Start(ctx, req("o-44"), map[string]int{"amount": 5}); err != nil {
		t.Fatal(err)
	}
	ctltest.Find(t, ctl, url, clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Key: "o-44"}, next(t, l.tasks).env.Idem.Key)
	payload := `{"order": "o-45", "amount": 7}`
	if _, err := l.s.Start(ctx, idem.Request{Payload: []byte(payload)}, nil); err != nil {
		t.Fatal(err)
	}
	ctltest.Find(t, ctl, url, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: payload}, next(t, l.tasks).env.Idem.Key)
}
