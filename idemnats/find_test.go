package idemnats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemnats"
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

// consumetest's find scenario: an operator who has a message's
// Nats-Msg-Id finds its record from that alone (clientkey.Key, which the
// consumer keys its records with).
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	consumetest.RecordIsFound(t, sharedStore, func(t *testing.T, e *idem.Engine) []clientkey.Material {
		js, s, subj := stream(t)
		ctx := context.Background()
		m := nats.NewMsg(subj)
		m.Header.Set(nats.MsgIdHdr, "shipment-42")
		m.Data = []byte(`{"order":"42"}`)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "find", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		p, err := idemnats.Wrap(e, &idemnats.Config{Operation: "ship", AckWait: time.Second},
			func(ctx context.Context, m jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
		if err != nil {
			t.Fatal(err)
		}
		if d, err := p(ctx, fetchOne(t, cons, time.Second)); d != idemnats.Acked || err != nil {
			t.Fatalf("%v %v", d, err)
		}
		return []clientkey.Material{{Kind: clientkey.KindKey, Operation: "ship", Key: "shipment-42"}}
	})
}
