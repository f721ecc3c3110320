package idemwatermill_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A message without a key is settled by consume.Decide's verdict for "no
// usable key", as every consumer's is: dead-lettered, its handler not run.
func TestNoKeyIsSettledByDecide(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	e, err := idem.New(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []consume.Verdict
	mw, err := idemwatermill.Middleware(e, &idemwatermill.Config{
		Operation:   "ship",
		MetadataKey: "order",
		Settled:     func(_ *message.Message, v consume.Verdict) { got = append(got, v) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran for a message without a key")
		return nil, nil
	})
	_, err = h(message.NewMessage("uuid-1", []byte(`{}`)))
	if !idemwatermill.IsDeadLetter(err) {
		t.Errorf("handler error %v, want a dead letter", err)
	}
	if len(got) != 1 || got[0].Action != consume.DeadLetter || !errors.Is(got[0].Err, consume.ErrNoKey) || !errors.Is(got[0].Err, idemwatermill.ErrNoKey) {
		t.Errorf("verdicts %+v, want one DeadLetter with consume.ErrNoKey and idemwatermill.ErrNoKey", got)
	}
}
