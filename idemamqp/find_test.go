package idemamqp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// An operator who has a delivery's MessageId finds its record from that
// alone, in the console and with `idemctl find -message`, through
// clientkey.Key, which the consumer keys its records with — on a real
// Redis that idemctl opens by URL.
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	prefix := fmt.Sprintf("idemamqp-find-%d:", rand.Uint64())
	st, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	conn := dial(t)
	work, _ := queues(t, conn)
	cnt := newCounter()
	c, err := idemamqp.New(engine(t, st, idem.Config{}), &idemamqp.Config{Operation: "invoice", Settled: cnt.settled},
		func(ctx context.Context, d amqp.Delivery) error { cnt.effect(d.MessageId); return nil })
	if err != nil {
		t.Fatal(err)
	}
	publish(t, channel(t, conn), work, "invoice-42", []byte(`{"n":42}`))
	run(t, conn, c, work, 1)
	eventually(t, 10*time.Second, "acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
	material := clientkey.Material{Kind: clientkey.KindKey, Operation: "invoice", Key: "invoice-42"}
	key := consoletest.FindIn(t, st, material)
	ctltest.Find(t, ctltest.Build(t), "redis://"+addr+"/0?prefix="+prefix, material, key)
}
