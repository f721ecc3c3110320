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

// brokerNames are the brokers of the tables that run on every broker,
// for newBroker.
var brokerNames = []string{"RedisStreams", "NATSJetStream", "RabbitMQ", "PostgreSQL"}

// newBroker is the broker named name (one of brokerNames).
func newBroker(t testing.TB, name string) broker {
	switch name {
	case "RedisStreams":
		return redisBroker(t)
	case "NATSJetStream":
		return natsBroker(t)
	case "RabbitMQ":
		return rabbitBroker(t)
	case "PostgreSQL":
		return pgBroker(t)
	}
	t.Fatalf("no broker %q", name)
	return broker{}
}

// The verdict table on NATS JetStream (watermill-nats's jetstream
// package, the real server), a stream per topic.
func TestVerdictsNATSJetStream(t *testing.T) { verdicts(t, natsBroker(t)) }

// natsBroker is NATS JetStream: a stream per topic, with one durable
// consumer "g" that the group's members share; a message delivered to a
// member that does not ack it comes again after the consumer's AckWait,
// heldFor.
//
// Connections wait up to 10s for the server's handshake (nats.go's default
// is 2s, which a loaded machine can miss).
func natsBroker(t testing.TB) broker {
	url := "nats://" + testenv.Reach(t, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
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
	// conn is a connection of the test's, closed at cleanup: a
	// subscriber's Close only drains its connection, which ends in the
	// background, after goleak may have looked.
	conn := func(t testing.TB) *nats.Conn {
		nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	return broker{
		topic: func(t testing.TB) string {
			name := fmt.Sprintf("idemwatermill_%d", rand.Uint64())
			stream, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.MemoryStorage})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
			if _, err := stream.CreateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "g", AckPolicy: jetstream.AckExplicitPolicy, AckWait: heldFor}); err != nil {
				t.Fatal(err)
			}
			return name
		},
		publish: func(t testing.TB, topic string, m *message.Message) {
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		},
		subscriber: func(t testing.TB, _ string) message.Subscriber {
			sub, err := wjetstream.NewSubscriber(wjetstream.SubscriberConfig{Conn: conn(t), Logger: watermill.NopLogger{},
				NakDelay: wjetstream.NewStaticDelay(50 * time.Millisecond)})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
		member: func(t testing.TB, _, _ string) message.Subscriber {
			sub, err := wjetstream.NewSubscriber(wjetstream.SubscriberConfig{Conn: conn(t), Logger: watermill.NopLogger{},
				NakDelay: wjetstream.NewStaticDelay(50 * time.Millisecond),
				ResourceInitializer: wjetstream.ExistingConsumer(func(string, string) jetstream.ConsumerConfig {
					return jetstream.ConsumerConfig{Name: "g"}
				}, "g")})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
	}
}

// The verdict table on RabbitMQ (watermill-amqp, the real broker), a
// durable queue per topic.
func TestVerdictsRabbitMQ(t *testing.T) { verdicts(t, rabbitBroker(t)) }

// rabbitBroker is RabbitMQ: a durable queue per topic, its consumers the
// group's members; a member's connection heartbeats every half heldFor,
// so that a stopped member's connection is closed, and its unacknowledged
// message requeued, about heldFor after it stopped (a dead member's at
// once).
func rabbitBroker(t testing.TB) broker {
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
	memberCfg := wamqp.NewDurableQueueConfig(uri)
	memberCfg.Connection.AmqpConfig = &amqp.Config{Heartbeat: heldFor / 2, Locale: "en_US"}
	return broker{
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
		member: func(t testing.TB, _, _ string) message.Subscriber {
			sub, err := wamqp.NewSubscriber(memberCfg, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		},
	}
}

// The verdict table on PostgreSQL (watermill-sql, the real server), a
// table per topic, as a queue (PostgreSQLQueueSchema: rows locked with
// SKIP LOCKED). Its default schema would not do for a message held while
// another is consumed: it shows a subscriber only rows older than every
// open transaction, and a held message's is open (HeldElsewhere waits
// for ever).
func TestVerdictsPostgreSQL(t *testing.T) { verdicts(t, pgBroker(t)) }

// pgBroker is PostgreSQL (watermill-sql's queue schema): a table per
// topic, its subscribers the group's members. A subscriber holds a
// message's row locked in a transaction until the ack; a member's
// sessions end a transaction idle for heldFor, so that a stopped member's
// message goes to another then (a dead member's at once).
func pgBroker(t testing.TB) broker {
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
	subscriber := func(t testing.TB, db wsql.Beginner) message.Subscriber {
		sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
			SchemaAdapter: wsql.PostgreSQLQueueSchema{}, OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{},
			InitializeSchema: true, PollInterval: 20 * time.Millisecond, ResendInterval: 20 * time.Millisecond,
		}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	return broker{
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
		subscriber: func(t testing.TB, _ string) message.Subscriber { return subscriber(t, db) },
		member: func(t testing.TB, _, _ string) message.Subscriber {
			pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable&idle_in_transaction_session_timeout=%d", addr, heldFor.Milliseconds()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return subscriber(t, wsql.BeginnerFromPgx(pool))
		},
	}
}
