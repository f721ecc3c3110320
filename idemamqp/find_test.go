package idemamqp_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// sharedStore is consumetest's store on the real Redis, which idemctl and
// a child consumer open too.
func sharedStore(t testing.TB, prefix string) (store.Store, string) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	st, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, "redis://" + addr + "/0?prefix=" + prefix
}

// consumetest's find scenario: an operator who has a delivery's MessageId
// finds its record from that alone (clientkey.Key, which the consumer
// keys its records with).
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	consumetest.RecordIsFound(t, sharedStore, func(t *testing.T, e *idem.Engine) []clientkey.Material {
		conn := dial(t)
		work, _ := queues(t, conn)
		cnt := newCounter()
		c, err := idemamqp.New(e, &idemamqp.Config{Operation: "invoice", Settled: cnt.settled},
			func(ctx context.Context, d amqp.Delivery) error { cnt.effect(d.MessageId); return nil })
		if err != nil {
			t.Fatal(err)
		}
		publish(t, channel(t, conn), work, "invoice-42", []byte(`{"n":42}`))
		run(t, conn, c, work, 1)
		eventually(t, 10*time.Second, "acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
		return []clientkey.Material{{Kind: clientkey.KindKey, Operation: "invoice", Key: "invoice-42"}}
	})
}
