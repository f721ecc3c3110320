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
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// An operator who has a message's Nats-Msg-Id finds its record in the
// console from that alone (clientkey.Key, which idemctl find -message
// uses too), on every backend.
func TestRecordIsFoundFromTheMessageID(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
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
			st := b.store(t)
			p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Lease: 2 * time.Second}), &idemnats.Config{Operation: "ship", AckWait: time.Second},
				func(ctx context.Context, m jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
			if err != nil {
				t.Fatal(err)
			}
			if d, err := p(ctx, fetchOne(t, cons, time.Second)); d != idemnats.Acked || err != nil {
				t.Fatalf("%v %v", d, err)
			}
			consoletest.FindIn(t, st, clientkey.Material{Kind: clientkey.KindKey, Operation: "ship", Key: "shipment-42"})
		})
	}
}
