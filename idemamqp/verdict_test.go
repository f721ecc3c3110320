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

// The consumers' table (idemtest/consumetest), through a real RabbitMQ, on
// each path: every situation settles the delivery by consume's verdict,
// with the broker action that verdict calls for. On the batch path each
// case's delivery comes in one batch after another delivery (a fresh key
// whose handler succeeds), so its key is claimed in a batch claim; it must
// be settled by the same verdict and broker action as alone, and the other
// delivery must be acked whatever happened to it.
func TestVerdicts(t *testing.T) {
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			conn := dial(t)
			ch := channel(t, conn)
			consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) verdict.Verdict {
				work, _ := queues(t, conn)
				other := "other-" + key + "-" + work
				ids := []string{key}
				if pa.batch {
					ids = []string{other, key}
				}
				for _, id := range ids {
					publish(t, ch, work, id, payload)
				}
				var ds []amqp.Delivery
				for range ids {
					ds = append(ds, get(t, ch, work))
				}
				c, err := idemamqp.New(f.Engine, &idemamqp.Config{Operation: f.Operation, Backoff: 10 * time.Millisecond},
					func(ctx context.Context, d amqp.Delivery) error {
						if d.MessageId == other {
							return nil
						}
						return handle(ctx)
					})
				if err != nil {
					t.Fatal(err)
				}
				ss := pa.handle(context.Background(), c, ds)
				if pa.batch {
					if f.Store.Calls("claim_batch") == 0 {
						t.Error("the batch's keys were not claimed in a batch claim")
					}
					if ss[0].Action != idemamqp.Acked {
						t.Errorf("the other delivery of the batch: %v (%v), want acked", ss[0].Action, ss[0].Err)
					}
				}
				s := ss[len(ss)-1]
				want := map[verdict.Action][]idemamqp.Action{
					verdict.Done: {idemamqp.Acked}, verdict.DeadLetter: {idemamqp.Rejected},
					verdict.RetryAfter: {idemamqp.Requeued}, verdict.Retry: {idemamqp.Requeued}, verdict.Leave: {idemamqp.Requeued},
				}[s.Verdict.Action]
				if len(want) == 0 || s.Action != want[0] {
					t.Errorf("verdict %v carried out as %v, want %v", s.Verdict.Action, s.Action, want)
				}
				return s.Verdict
			})
		})
	}
}
