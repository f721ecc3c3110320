package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemwatermill"
)

// read returns the payloads and UUIDs of the first n messages of topic,
// through a subscriber of its own group.
func (s *streams) read(topic string, n int) []*message.Message {
	sub := s.subscriber("reader", "r", time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		s.t.Fatal(err)
	}
	var out []*message.Message
	for len(out) < n {
		select {
		case m := <-ch:
			m.Ack()
			out = append(out, m)
		case <-ctx.Done():
			s.t.Fatalf("%d of %d messages on %s", len(out), n, topic)
		}
	}
	return out
}

// The composition the package doc gives: PoisonQueueWithFilter(IsDeadLetter)
// outermost, then Retry with ShouldRetry !IsDeadLetter, then idem. A
// terminal error runs once, is not retried, and goes to the poison queue
// (acked); a retryable error is retried in process, each attempt through
// the engine, until it succeeds.
func TestRetryAndPoisonQueue(t *testing.T) {
	t.Parallel()
	s := newStreams(t)
	topic, poison := s.topic(), s.topic()
	e := newEngine(t, redisStore(t, fmt.Sprintf("idemwm-compose-%d:", rand.Uint64())), idem.Config{Lease: 30 * time.Second})
	pq, err := middleware.PoisonQueueWithFilter(s.pub, poison, idemwatermill.IsDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t)
	r.AddMiddleware(pq, middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond,
		ShouldRetry: func(p middleware.RetryParams) bool { return !idemwatermill.IsDeadLetter(p.Err) }}.Middleware)
	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	_, err = idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{Operation: "ship", MetadataKey: "Idem-Key"}, "ship", topic,
		s.subscriber("g", "c", time.Hour), func(m *message.Message) error {
			k := m.Metadata.Get("Idem-Key")
			mu.Lock()
			runs[k]++
			n := runs[k]
			mu.Unlock()
			switch {
			case k == "declined":
				return idem.Terminal(errors.New("card declined"), "declined")
			case k == "flaky" && n == 1:
				return errors.New("downstream timeout")
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	s.publish(topic, msg("declined", []byte(`{"order":1}`)), msg("flaky", []byte(`{"order":2}`)))

	got := s.read(poison, 1)
	if k := got[0].Metadata.Get("Idem-Key"); k != "declined" || got[0].Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
		t.Errorf("poisoned %q with metadata %v, want declined with a reason", k, got[0].Metadata)
	}
	waitFor(t, 10*time.Second, "both acked", func() bool {
		p, err := s.client.XPending(context.Background(), topic, "g").Result()
		return err == nil && p.Count == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(runs) != "map[declined:1 flaky:2]" {
		t.Errorf("handlers ran %v, want declined once (not retried), flaky twice", runs)
	}
}

// A copy of a message that was handled replays the messages its handler
// produced, with their UUIDs: the router publishes them again, and the
// handler does not run.
func TestReplayPublishesTheSameMessages(t *testing.T) {
	t.Parallel()
	s := newStreams(t)
	in, out := s.topic(), s.topic()
	e := newEngine(t, redisStore(t, fmt.Sprintf("idemwm-replay-%d:", rand.Uint64())), idem.Config{Lease: 30 * time.Second})
	r := newRouter(t)
	var (
		mu   sync.Mutex
		runs int
	)
	_, err := idemwatermill.AddHandler(r, e, &idemwatermill.Config{Operation: "ship", MetadataKey: "Idem-Key"}, "ship", in,
		s.subscriber("g", "c", time.Hour), out, s.pub, func(m *message.Message) ([]*message.Message, error) {
			mu.Lock()
			runs++
			mu.Unlock()
			shipped := message.NewMessage(fmt.Sprintf("shipped-%d", rand.Uint64()), []byte(`{"shipped":true}`))
			shipped.Metadata.Set("Order", m.Metadata.Get("Idem-Key"))
			return []*message.Message{shipped}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	s.publish(in, msg("order-1", []byte(`{"order":1}`)))
	s.publish(in, msg("order-1", []byte(`{"order":1}`)))
	got := s.read(out, 2)
	if got[0].UUID != got[1].UUID || string(got[1].Payload) != `{"shipped":true}` || got[1].Metadata.Get("Order") != "order-1" {
		t.Errorf("published %s %s %v and %s %s %v, want the same message twice", got[0].UUID, got[0].Payload, got[0].Metadata, got[1].UUID, got[1].Payload, got[1].Metadata)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Errorf("the handler ran %d times, want 1", runs)
	}
}
