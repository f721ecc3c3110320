package idemwatermill_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// channelRouter runs cfg's handler on topics of Watermill's in-process Go
// channel, on one engine; send publishes a message to a topic and returns
// its verdict (each message is sent once the one before was settled).
type channelRouter struct {
	pubSub  *gochannel.GoChannel
	settled chan consume.Verdict
	mu      sync.Mutex
	ran     []string
}

func newChannelRouter(t *testing.T, cfg idemwatermill.Config, topics ...string) *channelRouter {
	c := &channelRouter{pubSub: gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{}), settled: make(chan consume.Verdict, 16)}
	t.Cleanup(func() { c.pubSub.Close() })
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	e := newEngine(t, st, idem.Config{Lease: 30 * time.Second})
	r := newRouter(t)
	cfg.Operation, cfg.MaxDelay = "ship", -1
	// A dead letter is nacked, and the Go channel redelivers it until the
	// router closes: those verdicts, after the test read its own, are
	// dropped.
	cfg.Settled = func(_ *message.Message, v consume.Verdict) {
		select {
		case c.settled <- v:
		default:
		}
	}
	for _, tp := range topics {
		if _, err := idemwatermill.AddConsumerHandler(r, e, &cfg, "ship-"+tp, tp, c.pubSub, func(m *message.Message) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.ran = append(c.ran, message.SubscribeTopicFromCtx(m.Context())+" "+string(m.Payload))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	runRouter(t, r)
	return c
}

func (c *channelRouter) send(t *testing.T, topic, uuid, payload string) consume.Verdict {
	t.Helper()
	if err := c.pubSub.Publish(topic, message.NewMessage(uuid, []byte(payload))); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-c.settled:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("the message to %s was not settled", topic)
		return consume.Verdict{}
	}
}

// By default a message is keyed by its payload under the topic the router
// subscribed to: a producer's retry (a new UUID, the same payload) is a
// duplicate; another payload is another message; the same payload on
// another topic is another message. With KeyFromUUID the UUID keys it, and
// a UUID sent again with another payload is a key reused: dead-lettered.
func TestDefaultKeyIsThePayloadUnderTheTopic(t *testing.T) {
	t.Parallel()
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		c := newChannelRouter(t, idemwatermill.Config{}, "orders", "refunds")
		for _, m := range []struct{ topic, uuid, payload string }{
			{"orders", "u1", `{"order":42}`},
			{"orders", "u2", `{"order":42}`}, // the producer's retry
			{"orders", "u3", `{"order":43}`},
			{"refunds", "u4", `{"order":42}`},
		} {
			if v := c.send(t, m.topic, m.uuid, m.payload); v.Action != consume.Done {
				t.Fatalf("%+v: %v %v, want done", m, v.Action, v.Err)
			}
		}
		if v := c.send(t, "orders", "u5", ""); v.Action != consume.DeadLetter || !errors.Is(v.Err, idemwatermill.ErrNoKey) {
			t.Fatalf("an empty payload: %v %v, want a dead letter, no key", v.Action, v.Err)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if want := []string{`orders {"order":42}`, `orders {"order":43}`, `refunds {"order":42}`}; len(c.ran) != 3 || c.ran[0] != want[0] || c.ran[1] != want[1] || c.ran[2] != want[2] {
			t.Errorf("ran %q, want %q", c.ran, want)
		}
	})
	t.Run("KeyFromUUID", func(t *testing.T) {
		t.Parallel()
		c := newChannelRouter(t, idemwatermill.Config{KeyFromUUID: true}, "orders")
		if v := c.send(t, "orders", "u1", `{"order":42}`); v.Action != consume.Done {
			t.Fatalf("%v %v", v.Action, v.Err)
		}
		if v := c.send(t, "orders", "u2", `{"order":42}`); v.Action != consume.Done {
			t.Fatalf("%v %v", v.Action, v.Err)
		}
		if v := c.send(t, "orders", "u1", `{"order":44}`); v.Action != consume.DeadLetter || !errors.Is(v.Err, idem.ErrMismatch) {
			t.Fatalf("a UUID sent again with another payload: %v %v, want a dead letter, a key reused", v.Action, v.Err)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.ran) != 2 {
			t.Errorf("ran %q, want the two UUIDs once each", c.ran)
		}
	})
}

// The record's fingerprint is the SHA-256 of the payload and the metadata
// (sorted, each length-prefixed), hashed once: the hex of the documented
// digest, as an operator comparing a payload computes it.
func TestFingerprintIsHashedOnce(t *testing.T) {
	t.Parallel()
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	e := newEngine(t, st, idem.Config{Lease: 30 * time.Second})
	mw, err := idemwatermill.Middleware(e, &idemwatermill.Config{Operation: "ship", MetadataKey: "Idem-Key"})
	if err != nil {
		t.Fatal(err)
	}
	m := msg("order-1", []byte(`{"order":1}`))
	m.Metadata.Set("Region", "eu")
	m.Metadata.Set("_watermill_amqp_redelivered", "true")
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(m); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, f := range []string{`{"order":1}`, "Idem-Key", "order-1", "Region", "eu"} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		h.Write([]byte(f))
	}
	id, err := (&idem.Request{Operation: "ship", Key: "order-1"}).Identity()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(context.Background(), id.StoreKey.String())
	if err != nil {
		t.Fatal(err)
	}
	// The record carries the rules its fingerprint was made by ("v1:").
	if want := "v1:" + hex.EncodeToString(h.Sum(nil)); rec.Fingerprint != want {
		t.Errorf("fingerprint %s, want %s", rec.Fingerprint, want)
	}
}
