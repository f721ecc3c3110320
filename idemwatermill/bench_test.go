package idemwatermill_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wjetstream "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// benchStreamsRedis is the Redis that is the Redis Streams broker
// (IDEM_REDISSTREAM_ADDR, by default the one on :6379), whose CPU the
// Redis Streams rows report as broker-cpu-µs/msg; when it is the store's
// too, the two are one figure, reported as the store's.
func benchStreamsRedis() string {
	if a := os.Getenv("IDEM_REDISSTREAM_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// benchBroker is a broker for BenchmarkConsume: prepare publishes n
// messages with distinct keys on a topic of their own and returns a
// subscriber per member of one group; cpu starts metering the store's
// Redis and the broker.
type benchBroker struct {
	name    string
	prepare func(b *testing.B, n, members int) (topic string, subs []message.Subscriber)
	cpu     func(b *testing.B) (report func(n int))
}

func benchMsg(i int) *message.Message {
	return msg("order-"+strconv.Itoa(i), []byte(`{"order":`+strconv.Itoa(i)+`}`))
}

func redisStreamsBench() benchBroker {
	return benchBroker{
		name: "RedisStreams",
		prepare: func(b *testing.B, n, members int) (string, []message.Subscriber) {
			addr := benchStreamsRedis()
			c := redis.NewClient(&redis.Options{Addr: addr})
			b.Cleanup(func() { c.Close() })
			if err := c.Ping(context.Background()).Err(); err != nil {
				testenv.Missing(b, fmt.Sprintf("no Redis at %s: %v", addr, err))
			}
			pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(c.Options())}, watermill.NopLogger{})
			if err != nil {
				b.Fatal(err)
			}
			defer pub.Close()
			topic := fmt.Sprintf("idemwatermill-bench-%d", rand.Uint64())
			b.Cleanup(func() { c.Del(context.Background(), topic) })
			for i := range n {
				if err := pub.Publish(topic, benchMsg(i)); err != nil {
					b.Fatal(err)
				}
			}
			subs := make([]message.Subscriber, members)
			for i := range subs {
				sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
					Client: redis.NewClient(c.Options()), ConsumerGroup: "g", Consumer: "c" + strconv.Itoa(i), OldestId: "0",
					BlockTime: 100 * time.Millisecond, ClaimInterval: time.Hour, MaxIdleTime: time.Hour, CheckConsumersInterval: time.Hour,
				}, watermill.NopLogger{})
				if err != nil {
					b.Fatal(err)
				}
				subs[i] = sub
			}
			return topic, subs
		},
		cpu: func(b *testing.B) func(int) {
			if benchStreamsRedis() == benchkit.StoreRedis() {
				cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), "")
				return func(n int) { cpu.Report(b, n) }
			}
			cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), "")
			brk, err := benchkit.RedisCPU(benchStreamsRedis())
			return func(n int) {
				cpu.Report(b, n)
				if after, err2 := benchkit.RedisCPU(benchStreamsRedis()); err == nil && err2 == nil {
					b.ReportMetric(float64((after-brk).Microseconds())/float64(n), "broker-cpu-µs/msg")
				}
			}
		},
	}
}

func natsBench() benchBroker {
	return benchBroker{
		name: "NATSJetStream",
		prepare: func(b *testing.B, n, members int) (string, []message.Subscriber) {
			url := "nats://" + testenv.Reach(b, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
			conn := func() *nats.Conn {
				nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(nc.Close)
				return nc
			}
			js, err := jetstream.New(conn())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			topic := fmt.Sprintf("idemwatermill_bench_%d", rand.Uint64())
			stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: topic, Subjects: []string{topic}, Storage: jetstream.MemoryStorage})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = js.DeleteStream(context.Background(), topic) })
			if _, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "g", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000}); err != nil {
				b.Fatal(err)
			}
			pub, err := wjetstream.NewPublisher(wjetstream.PublisherConfig{Conn: conn(), Logger: watermill.NopLogger{}})
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				if err := pub.Publish(topic, benchMsg(i)); err != nil {
					b.Fatal(err)
				}
			}
			subs := make([]message.Subscriber, members)
			for i := range subs {
				sub, err := wjetstream.NewSubscriber(wjetstream.SubscriberConfig{Conn: conn(), Logger: watermill.NopLogger{},
					ResourceInitializer: wjetstream.ExistingConsumer(func(string, string) jetstream.ConsumerConfig {
						return jetstream.ConsumerConfig{Name: "g"}
					}, "g")})
				if err != nil {
					b.Fatal(err)
				}
				subs[i] = sub
			}
			return topic, subs
		},
		cpu: func(b *testing.B) func(int) {
			cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), "nats-server")
			return func(n int) { cpu.Report(b, n) }
		},
	}
}

// BenchmarkConsume consumes b.N messages with distinct keys through a
// Watermill router, on Redis Streams and NATS JetStream (watermill's own
// Pub/Subs): bare (a handler that only returns, the router acks), and
// with idemwatermill over memstore and over Redis, with 1 and 16 members
// of the group in the router (a subscriber and a handler each: Watermill's
// subscribers hand over one message at a time). It reports msgs/s and CPU
// per message: this process's, the store's Redis's and the broker's.
func BenchmarkConsume(b *testing.B) {
	for _, br := range []benchBroker{redisStreamsBench(), natsBench()} {
		for _, members := range []int{1, 16} {
			for _, with := range []string{"bare", "memstore", "redis"} {
				b.Run(fmt.Sprintf("%s/%s/c=%d", br.name, with, members), func(b *testing.B) {
					benchConsume(b, br, with, members)
				})
			}
		}
	}
}

func benchConsume(b *testing.B, br benchBroker, with string, members int) {
	topic, subs := br.prepare(b, b.N, members)
	var st store.Store
	switch with {
	case "memstore":
		ms := memstore.New(nil)
		b.Cleanup(func() { ms.Close() })
		st = ms
	case "redis":
		prefix := fmt.Sprintf("idemwm-bench-%d:", rand.Uint64())
		rc := redisClient(b)
		b.Cleanup(func() { cleanPrefix(rc, prefix) })
		st = redisStore(b, prefix)
	}
	var done atomic.Int64
	all := make(chan struct{})
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	// Outermost: counts each message handled without an error (the
	// router acks it next).
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err == nil && done.Add(1) == int64(b.N) {
				close(all)
			}
			return out, err
		}
	})
	var e *idem.Engine
	if st != nil {
		e, err = idem.New(st, &idem.Config{Lease: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
	}
	for i, sub := range subs {
		name := "h" + strconv.Itoa(i)
		h := func(*message.Message) error { return nil }
		if e == nil {
			r.AddConsumerHandler(name, topic, sub, h)
		} else if _, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{Operation: "ship", MetadataKey: "Idem-Key"}, name, topic, sub, h); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	report := br.cpu(b)
	start := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- r.Run(context.Background()) }()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages handled", done.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	report(b.N)
	r.Close()
	if err := <-exited; err != nil {
		b.Fatal(err)
	}
}
