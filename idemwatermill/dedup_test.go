package idemwatermill_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemwatermill"
)

// Watermill's own Deduplicator and idemwatermill side by side, on each
// broker, on one message published twice (a producer's retry: same
// payload, same key): the Deduplicator remembers in its process's memory,
// so a copy consumed after a restart, or by another replica, runs again;
// idem's record is in the store (Redis), and the copy is replayed.
func TestSideBySideWithDeduplicator(t *testing.T) {
	t.Parallel()
	for _, broker := range brokerNames {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			sideBySide(t, newBroker(t, broker))
		})
	}
}

func sideBySide(t *testing.T, b broker) {
	prefix := fmt.Sprintf("idemwm-dedup-%d:", rand.Uint64())
	rc := redisClient(t)
	t.Cleanup(func() { cleanPrefix(rc, prefix) })
	e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: 30 * time.Second})
	mws := map[string]func(t *testing.T) message.HandlerMiddleware{
		"watermill deduplicator": func(t *testing.T) message.HandlerMiddleware {
			repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return (&middleware.Deduplicator{Repository: repo}).Middleware
		},
		"idem": func(t *testing.T) message.HandlerMiddleware {
			mw, err := idemwatermill.Middleware(e, &idemwatermill.Config{Operation: "ship-" + strings.ReplaceAll(t.Name(), "/", "-"), MetadataKey: "Idem-Key"})
			if err != nil {
				t.Fatal(err)
			}
			return mw
		},
	}
	want := map[string]int{"watermill deduplicator": 2, "idem": 1}
	for _, situation := range []string{"restart", "second replica"} {
		for name, newMW := range mws {
			t.Run(situation+"/"+name, func(t *testing.T) {
				topic := b.topic(t)
				var (
					mu   sync.Mutex
					runs int
					seen = map[string]bool{} // the copies handled, by UUID
				)
				// consumer runs a router of consumer in group "g" with mw,
				// until stopped.
				consumer := func(consumer string, mw message.HandlerMiddleware) (stop func()) {
					r := newRouter(t)
					// A closed subscriber's reader may still take one
					// message before it ends (watermill-redisstream): it
					// stays with that member until the live one gets it
					// (heldFor).
					h := r.AddConsumerHandler("ship", topic, b.member(t, topic, consumer), func(*message.Message) error {
						mu.Lock()
						runs++
						mu.Unlock()
						return nil
					})
					// Outermost, the first middleware given: notes every
					// copy handled, whether the handler ran or not. A
					// router stopped just after a copy was handled may
					// leave it unacknowledged (watermill-sql's ack is
					// cancelled with the subscription): it comes again,
					// to the next consumer, and both middlewares let it
					// run at most once more in all, as the count below
					// shows.
					h.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
						return func(m *message.Message) ([]*message.Message, error) {
							out, err := h(m)
							mu.Lock()
							seen[m.UUID] = true
							mu.Unlock()
							return out, err
						}
					}, mw)
					return runRouter(t, r)
				}
				copyOf := func() *message.Message { return msg("order-42", []byte(`{"order":42}`)) }
				handled := func(m *message.Message) func() bool {
					return func() bool { mu.Lock(); defer mu.Unlock(); return seen[m.UUID] }
				}

				mwA := newMW(t)
				stopA := consumer("a", mwA)
				first := copyOf()
				b.publish(t, topic, first)
				waitFor(t, 10*time.Second, "the first copy", handled(first))
				stopA()
				switch situation {
				case "restart":
					// The same consumer again, in a new process: a new
					// middleware.
					consumer("a", newMW(t))
				case "second replica":
					// Another replica of the service, with its own
					// middleware; a's is still in memory, unseen by it.
					consumer("b", newMW(t))
				}
				second := copyOf()
				b.publish(t, topic, second)
				waitFor(t, 10*time.Second, "the second copy", handled(second))
				mu.Lock()
				defer mu.Unlock()
				if runs != want[name] {
					t.Errorf("the handler ran %d times, want %d", runs, want[name])
				}
			})
		}
	}
}
