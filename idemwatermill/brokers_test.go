package idemwatermill_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wjetstream "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// The verdict table on NATS JetStream (watermill-nats's jetstream
// package, the real server), a stream per topic.
func TestVerdictsNATSJetStream(t *testing.T) {
	url := "nats://" + testenv.Reach(t, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := wjetstream.NewPublisher(wjetstream.PublisherConfig{URL: url, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	verdicts(t, broker{
		topic: func(t testing.TB) string {
			name := fmt.Sprintf("idemwatermill_%d", rand.Uint64())
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.MemoryStorage}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
			return name
		},
		publish: func(t testing.TB, topic string, m *message.Message) {
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
		subscriber: func(t testing.TB, _ string) message.Subscriber {
			// A connection of the test's, closed at cleanup: the
			// subscriber's Close only drains it, which ends in the
			// background, after goleak may have looked.
			nc, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			sub, err := wjetstream.NewSubscriber(wjetstream.SubscriberConfig{Conn: nc, Logger: watermill.NopLogger{},
				NakDelay: wjetstream.NewStaticDelay(50 * time.Millisecond)})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
	})
}

// The verdict table on RabbitMQ (watermill-amqp, the real broker), a
// durable queue per topic.
func TestVerdictsRabbitMQ(t *testing.T) {
	uri := "amqp://guest:guest@" + testenv.Reach(t, "RabbitMQ", "IDEM_AMQP_ADDR", "127.0.0.1:5672") + "/"
	conn, err := amqp.Dial(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cfg := wamqp.NewDurableQueueConfig(uri)
	pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	verdicts(t, broker{
		topic: func(t testing.TB) string {
			// The queue exists before the first publish (the publisher
			// does not declare it), as the subscriber declares it.
			name := fmt.Sprintf("idemwatermill-%d", rand.Uint64())
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if ch, err := conn.Channel(); err == nil {
					_, _ = ch.QueueDelete(name, false, false, true)
					ch.Close()
				}
			})
			return name
		},
		publish: func(t testing.TB, topic string, m *message.Message) {
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
		subscriber: func(t testing.TB, _ string) message.Subscriber {
			sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
		acked: func(t testing.TB, topic string) bool {
			ch, err := conn.Channel()
			if err != nil {
				return false
			}
			defer ch.Close()
			q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
			return err == nil && q.Messages == 0
		},
	})
}

// The verdict table on PostgreSQL (watermill-sql, the real server), a
// table per topic, as a queue (PostgreSQLQueueSchema: rows locked with
// SKIP LOCKED). Its default schema would not do for a message held while
// another is consumed: it shows a subscriber only rows older than every
// open transaction, and a held message's is open (HeldElsewhere waits
// for ever).
func TestVerdictsPostgreSQL(t *testing.T) {
	addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/test?sslmode=disable&pool_max_conns=32")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := wsql.BeginnerFromPgx(pool)
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: wsql.PostgreSQLQueueSchema{}, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	verdicts(t, broker{
		topic: func(t testing.TB) string {
			name := fmt.Sprintf("idemwatermill_%d", rand.Uint64())
			t.Cleanup(func() {
				ctx := context.Background()
				_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS "watermill_`+name+`"`)
				_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS "watermill_offsets_`+name+`"`)
			})
			return name
		},
		publish: func(t testing.TB, topic string, m *message.Message) {
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
		subscriber: func(t testing.TB, _ string) message.Subscriber {
			sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
				SchemaAdapter: wsql.PostgreSQLQueueSchema{}, OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
				InitializeSchema: true, PollInterval: 20 * time.Millisecond, ResendInterval: 20 * time.Millisecond,
			}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
	})
}
