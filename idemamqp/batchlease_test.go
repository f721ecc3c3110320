package idemamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/store"
)

// TestBatchHoldsItsClaims: consumetest's two members on a real RabbitMQ,
// each a RunBatch of its own (batches of 3, one handler at a time) on a
// queue of its own and a connection of its own, over one store (memstore, Redis):
// no item of X's batch runs after its claim lapsed while it waited behind
// the slow head, and Y's copies of the tail, held off while X holds them,
// are acked as replays.
func TestBatchHoldsItsClaims(t *testing.T) { batchTail(t, consumetest.BatchHoldsItsClaims) }

// TestBatchSkipsLapsedClaims: the same, X's renewals of the tail failing
// until Y has taken it over and run it: X does not run the tail, leaves
// it (Leave), and acks its redeliveries as replays of Y's outcomes.
func TestBatchSkipsLapsedClaims(t *testing.T) { batchTail(t, consumetest.BatchSkipsLapsedClaims) }

// batchTail runs scenario through this adapter's members, over each store.
func batchTail(t *testing.T, scenario func(*testing.T, store.Store, consumetest.NewMember)) {
	t.Parallel()
	for _, sk := range stores() {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			scenario(t, sk.new(t), func(t *testing.T, c consumetest.MemberConfig) consumetest.Member {
				conn := dial(t)
				work, _ := queues(t, conn)
				return &amqpMember{conn: conn, ch: channel(t, conn), queue: work, c: c}
			})
		})
	}
}

// amqpMember is a consumetest.Member: RunBatch on a queue of its own.
type amqpMember struct {
	conn  *amqp.Connection
	ch    *amqp.Channel // publishes
	queue string
	c     consumetest.MemberConfig
}

func (m *amqpMember) Publish(t *testing.T, key string, payload []byte) {
	publish(t, m.ch, m.queue, key, payload)
}

func (m *amqpMember) Start(t *testing.T) {
	c, err := idemamqp.New(m.c.Engine, &idemamqp.Config{Operation: m.c.Operation, Backoff: 250 * time.Millisecond,
		Settled: func(d amqp.Delivery, s idemamqp.Settlement) { m.c.Settled(d.MessageId, s.Action == idemamqp.Acked) }},
		func(ctx context.Context, d amqp.Delivery) error { return m.c.Handle(ctx, d.MessageId) })
	if err != nil {
		t.Fatal(err)
	}
	runBatch(t, m.conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: m.queue, Concurrency: m.c.Concurrency},
		Size: m.c.Size, Window: 250 * time.Millisecond, Batches: 1})
}
