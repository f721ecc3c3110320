package idemwatermill_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store"
)

// sharedStore is consumetest's store on the real Redis, which idemctl and
// a child router open too.
func sharedStore(t testing.TB, prefix string) (store.Store, string) {
	return redisStore(t, prefix), "redis://" + redisClient(t).Options().Addr + "/0?prefix=" + prefix
}

// consumetest's find scenario: an operator who has what the producer sent
// finds the record through clientkey, which the middleware keys its
// records with — messages published to Redis Streams: by default from the
// payload and the topic (-payload), with a chosen key from that key
// (-message: here the UUID, KeyFromUUID).
func TestRecordIsFoundFromWhatTheProducerSent(t *testing.T) {
	t.Parallel()
	consumetest.RecordIsFound(t, sharedStore, func(t *testing.T, e *idem.Engine) []clientkey.Material {
		s := newStreams(t)
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
		return []clientkey.Material{
			{Kind: clientkey.KindPayload, Operation: "ship", Topic: tp, Key: payload},
			{Kind: clientkey.KindKey, Operation: "ship-by-uuid", Key: m.UUID},
		}
	})
}
