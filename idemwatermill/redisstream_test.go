package idemwatermill_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Two goroutines of Watermill's own are not the middleware's: the Redis
// Streams reader sleeps half a second after the read its Close interrupted
// before it ends, and the Deduplicator's in-memory repository (in the
// side-by-side test) cleans out its keys until the process ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream.(*Subscriber).read"),
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/message/router/middleware.(*mapExpiringKeyRepository).cleanOutLoop"))
}

// redisClient is a client of the real Redis, closed at cleanup.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// streams is Watermill's Redis Streams Pub/Sub on the real Redis, on
// topics (streams) of the test's own, deleted at cleanup.
type streams struct {
	t      testing.TB
	client *redis.Client
	pub    *redisstream.Publisher
}

func newStreams(t testing.TB) *streams {
	c := redisClient(t)
	// The Pub/Sub closes its client on Close: each has one of its own.
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(c.Options())}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return &streams{t: t, client: c, pub: pub}
}

// topic is a stream of its own, deleted at cleanup.
func (s *streams) topic() string {
	name := fmt.Sprintf("idemwatermill-%d", rand.Uint64())
	s.t.Cleanup(func() { s.client.Del(context.Background(), name) })
	return name
}

// subscriber is a consumer of group on the real Redis, closed at cleanup;
// a message pending on a consumer idle for claimAfter is claimed by
// another.
func (s *streams) subscriber(group, consumer string, claimAfter time.Duration) *redisstream.Subscriber {
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client: redis.NewClient(s.client.Options()), ConsumerGroup: group, Consumer: consumer, OldestId: "0",
		BlockTime: 100 * time.Millisecond, ClaimInterval: 100 * time.Millisecond, MaxIdleTime: claimAfter,
		NackResendSleep: 50 * time.Millisecond, CheckConsumersInterval: time.Hour,
	}, watermill.NopLogger{})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { sub.Close() })
	return sub
}

func (s *streams) publish(topic string, msgs ...*message.Message) {
	if err := s.pub.Publish(topic, msgs...); err != nil {
		s.t.Fatal(err)
	}
}

// msg is a message keyed by key (metadata Idem-Key), with a fresh UUID.
func msg(key string, payload []byte) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set("Idem-Key", key)
	return m
}

// runRouter runs a router until cleanup (or stop).
func runRouter(t testing.TB, r *message.Router) (stop func()) {
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			r.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func newRouter(t testing.TB) *message.Router {
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newEngine(t testing.TB, st store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.New(st, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func redisStore(t testing.TB, prefix string) store.Store {
	st, err := redisstore.New(redisClient(t), &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// broker is a Watermill Pub/Sub on a real server, for the verdict table.
type broker struct {
	// topic makes a topic of the test's own, removed at cleanup.
	topic func(t testing.TB) string
	// publish publishes m on topic.
	publish func(t testing.TB, topic string, m *message.Message)
	// subscriber is a subscriber of a group of its own, closed by the
	// router.
	subscriber func(t testing.TB, topic string) message.Subscriber
	// acked reports whether nothing is left unacknowledged on topic, when
	// the broker can tell.
	acked func(t testing.TB, topic string) bool
	// member is a subscriber, as consumer, of topic's one group, closed by
	// the router: the group's members, in this process or another, share
	// the topic's messages, and a message held by a member that died or
	// stopped comes to another after at most heldFor (and a lease).
	member func(t testing.TB, topic, consumer string) message.Subscriber
}

// heldFor is how long a message held by a member that stopped, or died,
// stays with it before the broker gives it to another member.
const heldFor = 2 * time.Second

// verdicts runs the consumers' table (idemtest/consumetest) through a
// Watermill router on b: every situation settles the message by consume's
// verdict, carried out as the package doc says: an Ack for Done (nothing
// left unacknowledged, where the broker tells), a Nack for the others
// (the message comes again).
func verdicts(t *testing.T, b broker) {
	consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict {
		topic := b.topic(t)
		b.publish(t, topic, msg(key, payload))
		got := make(chan consume.Verdict, 1)
		var (
			mu      sync.Mutex
			settles int
		)
		r := newRouter(t)
		_, err := idemwatermill.AddConsumerHandler(r, f.Engine, &idemwatermill.Config{
			Operation: f.Operation, MetadataKey: "Idem-Key", MaxDelay: -1,
			Settled: func(_ *message.Message, v consume.Verdict) {
				mu.Lock()
				settles++
				mu.Unlock()
				select {
				case got <- v:
				default: // a redelivery
				}
			},
		}, "h", topic, b.subscriber(t, topic), func(m *message.Message) error { return handle(m.Context()) })
		if err != nil {
			t.Fatal(err)
		}
		stop := runRouter(t, r)
		defer stop()
		var v consume.Verdict
		select {
		case v = <-got:
		case <-time.After(20 * time.Second):
			t.Fatal("the message was never settled")
		}
		if v.Action != consume.Done {
			waitFor(t, 10*time.Second, "the nacked message again", func() bool { mu.Lock(); defer mu.Unlock(); return settles >= 2 })
		} else if b.acked != nil {
			waitFor(t, 10*time.Second, "the ack", func() bool { return b.acked(t, topic) })
		}
		return v
	})
}

// The verdict table on Redis Streams (watermill-redisstream, the real
// Redis).
func TestVerdictsRedisStreams(t *testing.T) { verdicts(t, redisBroker(t)) }

// redisBroker is Redis Streams: a stream per topic, consumer group "g";
// a member claims a message pending on another that has been idle for
// heldFor.
func redisBroker(t testing.TB) broker {
	s := newStreams(t)
	return broker{
		topic:      func(testing.TB) string { return s.topic() },
		publish:    func(_ testing.TB, topic string, m *message.Message) { s.publish(topic, m) },
		subscriber: func(testing.TB, string) message.Subscriber { return s.subscriber("g", "c", time.Hour) },
		acked: func(_ testing.TB, topic string) bool {
			p, err := s.client.XPending(context.Background(), topic, "g").Result()
			return err == nil && p.Count == 0
		},
		member: func(_ testing.TB, _, consumer string) message.Subscriber { return s.subscriber("g", consumer, heldFor) },
	}
}

// waitFor polls cond every 10ms until it holds, or fails t after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
