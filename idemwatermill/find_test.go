package idemwatermill_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/idemwatermill"
)

// An operator who has what the producer sent finds the record, in the
// console and with `idemctl find`, through clientkey, which the middleware
// keys its records with — messages published to Redis Streams, records on
// a real Redis that idemctl opens by URL: by default from the payload and
// the topic (-payload), with a chosen key from that key (-message: here
// the UUID, KeyFromUUID).
func TestRecordIsFoundFromWhatTheProducerSent(t *testing.T) {
	t.Parallel()
	s := newStreams(t)
	prefix := fmt.Sprintf("idemwatermill-find-%d:", rand.Uint64())
	st := redisStore(t, prefix)
	e := newEngine(t, st, idem.Config{Lease: 30 * time.Second})
	tp := s.topic()
	payload := "{\"order\": 42}\n" // byte for byte, white space and all
	m := message.NewMessage("3f1c0a4e-order-42", []byte(payload))
	s.publish(tp, m)
	r := newRouter(t)
	done := make(chan string, 2)
	for _, c := range []idemwatermill.Config{{Operation: "ship"}, {Operation: "ship-by-uuid", KeyFromUUID: true}} {
		c.Settled = func(_ *message.Message, v consume.Verdict) {
			if v.Action == consume.Done {
				done <- c.Operation
			}
		}
		if _, err := idemwatermill.AddConsumerHandler(r, e, &c, c.Operation, tp, s.subscriber(c.Operation, "c1", time.Minute),
			func(*message.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	stop := runRouter(t, r)
	for range 2 {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the message was not done by both handlers")
		}
	}
	stop()
	ctl := ctltest.Build(t)
	url := "redis://" + s.client.Options().Addr + "/0?prefix=" + prefix
	for _, material := range []clientkey.Material{
		{Kind: clientkey.KindPayload, Operation: "ship", Topic: tp, Key: payload},
		{Kind: clientkey.KindKey, Operation: "ship-by-uuid", Key: m.UUID},
	} {
		key := consoletest.FindIn(t, st, material)
		ctltest.Find(t, ctl, url, material, key)
	}
}
