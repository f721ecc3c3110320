package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// brokers are the seed brokers of the cluster t runs on: KAFKA_BROKERS
// (a real cluster), or a kfake emulator of its own, started here and
// closed at cleanup.
func brokers(t testing.TB) []string {
	t.Helper()
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		return strings.Split(b, ",")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// sessionTimeout is the group session timeout the tests' consumers ask
// for: short on the emulator; a real broker refuses less than its
// group.min.session.timeout.ms, 6s by default.
func sessionTimeout() time.Duration {
	if os.Getenv("KAFKA_BROKERS") != "" {
		return 6 * time.Second
	}
	return time.Second
}

// admin is an admin client of seeds, closed at cleanup.
func admin(t testing.TB, seeds []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// topic creates a topic of its own with partitions, deleted at cleanup.
func topic(t testing.TB, seeds []string, partitions int32) string {
	t.Helper()
	name := fmt.Sprintf("idemkafka-%d", rand.Uint64())
	adm := admin(t, seeds)
	resp, err := adm.CreateTopic(context.Background(), partitions, -1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopic(context.Background(), name) })
	return name
}

// produce writes records, each to the partition it names, and waits.
func produce(t testing.TB, seeds []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// committed is the group's committed offset of topic's partition, -1 for
// none.
func committed(t testing.TB, seeds []string, group, topic string, partition int32) int64 {
	t.Helper()
	os, err := admin(t, seeds).FetchOffsetsForTopics(context.Background(), group, topic)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	o, ok := os.Lookup(topic, partition)
	if !ok || o.Err != nil || o.At < 0 {
		return -1
	}
	return o.At
}

// groupOpts are the client options of a test consumer of group on topic.
func groupOpts(seeds []string, group, topic string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.SessionTimeout(sessionTimeout()), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
	}
}

// running is a Consumer running in a goroutine.
type running struct {
	c      *idemkafka.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs c until stop (or cleanup): stop ends Run, then closes c.
func start(t testing.TB, c *idemkafka.Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		r.c.Close()
	})
}

func newEngine(t testing.TB, st store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.New(st, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// redisStore is a store on the real Redis under a prefix of its own.
func redisStore(t testing.TB, prefix string) store.Store {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return st
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
