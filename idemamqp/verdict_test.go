package idemamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	verdict "github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// The consumers' table (idemtest/consumetest), through a real RabbitMQ:
// every situation settles the delivery by consume's verdict, with the
// broker action that verdict calls for.
func TestVerdicts(t *testing.T) {
	conn := dial(t)
	ch := channel(t, conn)
	consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) verdict.Verdict {
		work, _ := queues(t, conn)
		publish(t, ch, work, key, payload)
		var d amqp.Delivery
		for i := 0; ; i++ {
			got, ok, err := ch.Get(work, false)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				d = got
				break
			}
			if i == 500 {
				t.Fatal("the message never reached its queue")
			}
			time.Sleep(10 * time.Millisecond) // the broker, another process, routes the publish
		}
		c, err := idemamqp.New(f.Engine, &idemamqp.Config{Operation: f.Operation, Backoff: 10 * time.Millisecond},
			func(ctx context.Context, _ amqp.Delivery) error { return handle(ctx) })
		if err != nil {
			t.Fatal(err)
		}
		s := c.Handle(context.Background(), d)
		want := map[verdict.Action][]idemamqp.Action{
			verdict.Done: {idemamqp.Acked}, verdict.DeadLetter: {idemamqp.Rejected},
			verdict.RetryAfter: {idemamqp.Requeued}, verdict.Retry: {idemamqp.Requeued}, verdict.Leave: {idemamqp.Requeued},
		}[s.Verdict.Action]
		if len(want) == 0 || s.Action != want[0] {
			t.Errorf("verdict %v carried out as %v, want %v", s.Verdict.Action, s.Action, want)
		}
		return s.Verdict
	})
}
