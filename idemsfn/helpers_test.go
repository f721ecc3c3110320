package idemsfn_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// transport is the one the test clients share (dynamotest.Main closes its
// idle connections before it looks for leaked goroutines).
var transport = dynamotest.Transport

func TestMain(m *testing.M) { dynamotest.Main(m) }

var ctx = context.Background()

// machineArn is the state machine of the tests that need no server.
const machineArn = "arn:aws:states:us-east-1:123456789012:stateMachine:orders"

// counted is a store whose calls are counted (faultstore) and that still
// lists (the reconciler needs store.Lister).
type counted struct {
	*faultstore.Store
	lister store.Lister
}

func (c counted) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	return c.lister.List(ctx, p)
}

// rig is one test's engine, clock and counted store.
type rig struct {
	e     *idem.Engine
	clock *clocktest.Clock
	fs    *faultstore.Store
}

// newRig returns an engine over s (memstore when nil) whose calls are
// counted, on a manual clock; over a signedStore, the engine signs its
// tokens with tokenKey.
func newRig(t testing.TB, s store.Store) rig {
	t.Helper()
	if s == nil {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		t.Cleanup(func() { _ = mem.Close() })
		s = mem
	}
	var key []byte
	if ss, ok := s.(signedStore); ok {
		s, key = ss.Store, tokenKey
	}
	fs := faultstore.New(s)
	var st store.Store = fs
	if l, ok := s.(store.Lister); ok {
		st = counted{fs, l}
	}
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	e, err := idem.New(st, &idem.Config{Clock: clock, Expiry: 24 * time.Hour, Logger: slog.New(slog.DiscardHandler), TokenKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return rig{e: e, clock: clock, fs: fs}
}

// starter returns a Starter of arn for operation "orders" through api.
func (r rig) starter(t testing.TB, api idemsfn.API, arn string, cfg idemsfn.Config) *idemsfn.Starter {
	t.Helper()
	cfg.StateMachineArn, cfg.Operation = arn, "orders"
	if cfg.ExpectedCompletion == 0 {
		cfg.ExpectedCompletion = time.Minute
	}
	s, err := idemsfn.New(r.e, api, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// req is a request of operation "orders" with key k.
func req(k string) idem.Request {
	return idem.Request{Operation: "orders", Key: k, Payload: []byte(`{"order":"` + k + `"}`)}
}

// storeKey is the store key of req(k).
func storeKey(t testing.TB, k string) idem.StoreKey {
	t.Helper()
	r := req(k)
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// envelope reads an execution input.
func envelope(t testing.TB, input string) idemsfn.Envelope {
	t.Helper()
	env, _, err := idemsfn.ParseEnvelope([]byte(input))
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(t testing.TB, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// status reads the record of k.
func (r rig) status(t testing.TB, k string) *idem.State {
	t.Helper()
	st, err := r.e.Status(ctx, storeKey(t, k))
	if err != nil {
		t.Fatal(err)
	}
	return st
}
