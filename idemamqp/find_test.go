package idemamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// An operator who has a delivery's MessageId finds its record in the
// console from that alone (clientkey.Key, which idemctl find -message
// uses too), on every store.
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	for _, sk := range stores() {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, _ := queues(t, conn)
			cnt := newCounter()
			st := sk.new(t)
			c, err := idemamqp.New(engine(t, st, idem.Config{}), &idemamqp.Config{Operation: "invoice", Settled: cnt.settled},
				func(ctx context.Context, d amqp.Delivery) error { cnt.effect(d.MessageId); return nil })
			if err != nil {
				t.Fatal(err)
			}
			publish(t, channel(t, conn), work, "invoice-42", []byte(`{"n":42}`))
			run(t, conn, c, work, 1)
			eventually(t, 10*time.Second, "acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
			consoletest.FindIn(t, st, clientkey.Material{Kind: clientkey.KindKey, Operation: "invoice", Key: "invoice-42"})
		})
	}
}
