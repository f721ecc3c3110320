package idemnats_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// An operator who has a message's Nats-Msg-Id finds its record from that
// alone, in the console and with `idemctl find -message`, through
// clientkey.Key, which the consumer keys its records with — on a real
// Redis that idemctl opens by URL.
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	prefix := fmt.Sprintf("idemnats-find-%d:", rand.Uint64())
	st, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
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
	p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Lease: 2 * time.Second}), &idemnats.Config{Operation: "ship", AckWait: time.Second},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if d, err := p(ctx, fetchOne(t, cons, time.Second)); d != idemnats.Acked || err != nil {
		t.Fatalf("%v %v", d, err)
	}
	material := clientkey.Material{Kind: clientkey.KindKey, Operation: "ship", Key: "shipment-42"}
	key := consoletest.FindIn(t, st, material)
	ctltest.Find(t, ctltest.Build(t), "redis://"+addr+"/0?prefix="+prefix, material, key)
}
