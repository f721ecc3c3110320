package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dial connects to the broker under test and closes the connection at
// cleanup.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	addr := testenv.Reach(t, "RabbitMQ", "IDEM_AMQP_ADDR", "127.0.0.1:5672")
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// queues declares a work queue with a unique name, dead-lettering to a
// queue of its own (name+".dead"); both, and the delay queue, are deleted at
// cleanup.
func queues(t testing.TB, conn *amqp.Connection) (work, dead string) {
	t.Helper()
	ch := channel(t, conn)
	work = fmt.Sprintf("idemamqp-test-%d-%d", time.Now().UnixNano(), rand.Uint32())
	dead = work + ".dead"
	if _, err := ch.QueueDeclare(dead, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(work, false, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		for _, q := range []string{work, dead, work + ".idem-delay"} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return work, dead
}

func publish(t testing.TB, ch *amqp.Channel, queue, id string, body []byte) {
	t.Helper()
	if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{MessageId: id, Body: body}); err != nil {
		t.Fatal(err)
	}
}

func depth(t testing.TB, ch *amqp.Channel, q string) int {
	t.Helper()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

type storeKind struct {
	name string
	new  func(t testing.TB) store.Store
}

func stores() []storeKind {
	return []storeKind{
		{"memstore", func(t testing.TB) store.Store {
			s := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(t testing.TB) store.Store {
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			c := redis.NewClient(&redis.Options{Addr: addr})
			prefix := fmt.Sprintf("idemamqp-test:%d:%d:", time.Now().UnixNano(), rand.Uint32())
			s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx := context.Background()
				it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
				for it.Next(ctx) {
					c.Del(ctx, it.Val())
				}
				c.Close()
			})
			return s
		}},
	}
}

func engine(t testing.TB, s store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run starts c.Run on a channel of its own and stops it at cleanup.
func run(t testing.TB, conn *amqp.Connection, c *idemamqp.Consumer, queue string, n int) {
	t.Helper()
	ch := channel(t, conn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, ch, idemamqp.ConsumeArgs{Queue: queue, Concurrency: n}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counter counts effects and settlements.
type counter struct {
	mu      sync.Mutex
	effects map[string]int
	actions map[idemamqp.Action]int
	byID    map[string]int // deliveries per MessageId
}

func newCounter() *counter {
	return &counter{effects: map[string]int{}, actions: map[idemamqp.Action]int{}, byID: map[string]int{}}
}

func (c *counter) effect(id string) {
	c.mu.Lock()
	c.effects[id]++
	c.mu.Unlock()
}

func (c *counter) settled(d amqp.Delivery, s idemamqp.Settlement) {
	c.mu.Lock()
	c.actions[s.Action]++
	c.byID[d.MessageId]++
	c.mu.Unlock()
}

func (c *counter) action(a idemamqp.Action) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.actions[a]
}

// Three consumers (each its own connection and engine, one store) on one
// queue; 1,000 messages, 30% of them published two to four times with the
// same MessageId. Every message has its effect exactly once, and every
// copy is acknowledged. On each path: alone (Run, 8 handlers at once), or
// in batches of up to 16 (RunBatch, 4 handlers of a batch at once), where a
// producer's copies meet in one batch, in two batches of one consumer, or
// in two consumers.
func TestThreeConsumersExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		for _, sk := range stores() {
			t.Run(pa.name+"/"+sk.name, func(t *testing.T) {
				t.Parallel()
				s := sk.new(t)
				pubConn := dial(t)
				work, dead := queues(t, pubConn)
				cnt := newCounter()
				for i := range 3 {
					conn := dial(t)
					delay, err := idemamqp.DeclareDelay(channel(t, conn), work, 50*time.Millisecond)
					if err != nil {
						t.Fatal(err)
					}
					e := engine(t, s, idem.Config{Owner: "consumer-" + strconv.Itoa(i), Lease: 5 * time.Second})
					c, err := idemamqp.New(e, &idemamqp.Config{Operation: "effect", Delay: delay, Settled: cnt.settled},
						func(ctx context.Context, d amqp.Delivery) error {
							time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
							cnt.effect(d.MessageId)
							return nil
						})
					if err != nil {
						t.Fatal(err)
					}
					if pa.batch {
						runBatch(t, conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: work, Concurrency: 4}, Size: 16})
					} else {
						run(t, conn, c, work, 8)
					}
				}
				pub := channel(t, pubConn)
				const n = 1000
				var ids []string
				for i := range n {
					id := "m-" + strconv.Itoa(i)
					copies := 1
					if i%10 < 3 {
						copies = 2 + rand.IntN(3)
					}
					for range copies {
						ids = append(ids, id)
					}
				}
				rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
				for _, id := range ids {
					publish(t, pub, work, id, []byte(`{"id":"`+id+`"}`))
				}
				eventually(t, 60*time.Second, "every copy acknowledged", func() bool {
					return cnt.action(idemamqp.Acked) == len(ids)
				})
				cnt.mu.Lock()
				defer cnt.mu.Unlock()
				if len(cnt.effects) != n {
					t.Errorf("%d messages had an effect, want %d", len(cnt.effects), n)
				}
				for id, k := range cnt.effects {
					if k != 1 {
						t.Errorf("%s had its effect %d times", id, k)
					}
				}
				if cnt.actions[idemamqp.Rejected] != 0 || cnt.actions[idemamqp.Requeued] != 0 {
					t.Errorf("settlements %v", cnt.actions)
				}
				if d := depth(t, pub, dead); d != 0 {
					t.Errorf("%d messages dead-lettered", d)
				}
				t.Logf("%d copies of %d messages: %v", len(ids), n, cnt.actions)
			})
		}
	}
}

// A terminal error is stored: the first copy and every later one go to the
// dead-letter queue, and the handler runs once.
func TestTerminalErrorDeadLettered(t *testing.T) {
	t.Parallel()
	for _, sk := range stores() {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, dead := queues(t, conn)
			cnt := newCounter()
			var runs atomic.Int32
			c, err := idemamqp.New(engine(t, sk.new(t), idem.Config{}), &idemamqp.Config{Operation: "terminal", Settled: cnt.settled},
				func(ctx context.Context, d amqp.Delivery) error {
					runs.Add(1)
					return idem.Terminal(errors.New("card declined"), "declined")
				})
			if err != nil {
				t.Fatal(err)
			}
			pub := channel(t, conn)
			for range 3 {
				publish(t, pub, work, "poison", []byte("x"))
			}
			run(t, conn, c, work, 1)
			eventually(t, 10*time.Second, "three copies dead-lettered", func() bool { return depth(t, pub, dead) == 3 })
			// Three copies were published and all three are dead-lettered:
			// none is left to deliver. The consumer reports a rejection
			// once the broker has it, so wait for the third report.
			eventually(t, 10*time.Second, "three rejections reported", func() bool { return cnt.action(idemamqp.Rejected) >= 3 })
			if got := runs.Load(); got != 1 {
				t.Errorf("handler ran %d times, want 1", got)
			}
			if got := cnt.action(idemamqp.Rejected); got != 3 {
				t.Errorf("%d rejections, want 3 (%v)", got, cnt.actions)
			}
			if d := depth(t, pub, work); d != 0 {
				t.Errorf("work queue holds %d", d)
			}
		})
	}
}

// While one consumer holds a key, a copy on another does not spin: it
// comes back about once per delay (or per Backoff without a delay queue),
// and is acknowledged as a replay once the first finished.
func TestInProgressDoesNotSpin(t *testing.T) {
	t.Parallel()
	for _, delayed := range []bool{true, false} {
		t.Run(fmt.Sprintf("delayqueue=%t", delayed), func(t *testing.T) {
			t.Parallel()
			s := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { s.Close() })
			pubConn := dial(t)
			work, _ := queues(t, pubConn)
			cnt := newCounter()
			release := make(chan struct{})
			var runs atomic.Int32
			started := make(chan struct{}, 2)
			for i := range 2 {
				conn := dial(t)
				cfg := &idemamqp.Config{Operation: "slow", Settled: cnt.settled, Backoff: 100 * time.Millisecond}
				if delayed {
					d, err := idemamqp.DeclareDelay(channel(t, conn), work, 100*time.Millisecond)
					if err != nil {
						t.Fatal(err)
					}
					cfg.Delay = d
				}
				c, err := idemamqp.New(engine(t, s, idem.Config{Owner: "c" + strconv.Itoa(i)}), cfg, func(ctx context.Context, d amqp.Delivery) error {
					runs.Add(1)
					started <- struct{}{}
					<-release
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				run(t, conn, c, work, 1)
			}
			pub := channel(t, pubConn)
			publish(t, pub, work, "k", []byte("body"))
			<-started
			publish(t, pub, work, "k", []byte("body"))
			const hold = time.Second
			time.Sleep(hold)
			cnt.mu.Lock()
			settledWhileHeld := cnt.byID["k"]
			cnt.mu.Unlock()
			close(release)
			eventually(t, 10*time.Second, "both copies acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 2 })
			if runs.Load() != 1 {
				t.Errorf("handler ran %d times", runs.Load())
			}
			// One copy held; the other settled about once per 100ms (plus
			// the broker's round trip), not thousands of times.
			if settledWhileHeld > 12 || settledWhileHeld < 3 {
				t.Errorf("the duplicate was settled %d times in %v; want about %d", settledWhileHeld, hold, hold/(100*time.Millisecond))
			}
			t.Logf("duplicate settled %d times while held; %v", settledWhileHeld, cnt.actions)
		})
	}
}

// A retryable error is tried again through the delay queue until the
// handler succeeds; it has its effect once.
func TestRetryableErrorRetriedLater(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	work, _ := queues(t, conn)
	delay, err := idemamqp.DeclareDelay(channel(t, conn), work, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	cnt := newCounter()
	var runs atomic.Int32
	c, err := idemamqp.New(engine(t, memstore.New(&memstore.Config{SweepInterval: -1}), idem.Config{}),
		&idemamqp.Config{Operation: "flaky", Delay: delay, Settled: cnt.settled},
		func(ctx context.Context, d amqp.Delivery) error {
			if runs.Add(1) < 3 {
				return errors.New("downstream unavailable")
			}
			cnt.effect(d.MessageId)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	run(t, conn, c, work, 1)
	publish(t, channel(t, conn), work, "f", []byte("b"))
	eventually(t, 10*time.Second, "acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
	if runs.Load() != 3 || cnt.action(idemamqp.Delayed) != 2 || cnt.effects["f"] != 1 {
		t.Errorf("runs %d, settlements %v, effects %v", runs.Load(), cnt.actions, cnt.effects)
	}
}

// The same MessageId with another body is rejected, not replayed; a
// message without a MessageId is rejected.
func TestMismatchAndMissingKeyRejected(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	work, dead := queues(t, conn)
	cnt := newCounter()
	c, err := idemamqp.New(engine(t, memstore.New(&memstore.Config{SweepInterval: -1}), idem.Config{}),
		&idemamqp.Config{Operation: "m", Settled: cnt.settled},
		func(ctx context.Context, d amqp.Delivery) error { cnt.effect(d.MessageId); return nil })
	if err != nil {
		t.Fatal(err)
	}
	pub := channel(t, conn)
	publish(t, pub, work, "a", []byte("one"))
	publish(t, pub, work, "a", []byte("two"))
	publish(t, pub, work, "", []byte("three"))
	run(t, conn, c, work, 1)
	eventually(t, 10*time.Second, "two dead-lettered", func() bool { return depth(t, pub, dead) == 2 })
	if cnt.action(idemamqp.Acked) != 1 || cnt.action(idemamqp.Rejected) != 2 || cnt.effects["a"] != 1 {
		t.Errorf("settlements %v, effects %v", cnt.actions, cnt.effects)
	}
}

// A key from the body (Config.Key) catches one thing published under two
// MessageIds.
func TestKeyFromBody(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	work, _ := queues(t, conn)
	cnt := newCounter()
	c, err := idemamqp.New(engine(t, memstore.New(&memstore.Config{SweepInterval: -1}), idem.Config{}),
		&idemamqp.Config{Operation: "k", Settled: cnt.settled, Key: func(b []byte) (string, error) { return string(b), nil }},
		func(ctx context.Context, d amqp.Delivery) error { cnt.effect(string(d.Body)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	pub := channel(t, conn)
	publish(t, pub, work, "id-1", []byte("order-7"))
	publish(t, pub, work, "id-2", []byte("order-7"))
	run(t, conn, c, work, 1)
	eventually(t, 10*time.Second, "both acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 2 })
	if cnt.effects["order-7"] != 1 {
		t.Errorf("effects %v", cnt.effects)
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	s := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { s.Close() })
	fn := func(context.Context, amqp.Delivery) error { return nil }
	for name, tc := range map[string]struct {
		eng idem.Config
		cfg idemamqp.Config
	}{
		"lease over default consumer timeout": {idem.Config{Expiry: 2 * time.Hour, Lease: 31 * time.Minute}, idemamqp.Config{Operation: "x"}},
		"lease equal to consumer timeout":     {idem.Config{Lease: 10 * time.Second}, idemamqp.Config{Operation: "x", ConsumerTimeout: 10 * time.Second}},
		"wait over consumer timeout":          {idem.Config{Wait: 20 * time.Second, Lease: time.Second}, idemamqp.Config{Operation: "x", ConsumerTimeout: 10 * time.Second}},
		"no name":                             {idem.Config{}, idemamqp.Config{}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := idemamqp.New(engine(t, s, tc.eng), &tc.cfg, fn)
			if !errors.Is(err, idem.ErrInvalidConfig) {
				t.Fatalf("err %v, want idem.ErrInvalidConfig", err)
			}
			t.Log(err)
		})
	}
	c, err := idemamqp.New(engine(t, s, idem.Config{}), &idemamqp.Config{Operation: "x"}, fn)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background(), nil, idemamqp.ConsumeArgs{Queue: "q", AutoAck: true})
	if !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("auto-ack: err %v, want idem.ErrInvalidConfig", err)
	}
	t.Log(err)
}

// TestExample runs Example (which go test only compiles: it needs the
// broker) and checks its output.
func TestExample(t *testing.T) {
	dial(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	Example()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	want := "shipping {\"order\":42}\norder-42: acked replayed=false\norder-42: acked replayed=true\n"
	if string(out) != want {
		t.Errorf("Example printed\n%s\nwant\n%s", out, want)
	}
}

// An uncertain outcome keeps the claim until its lease ends: the message
// is delayed (not left unacknowledged, not run again) until then, and the
// first delivery after it runs the handler again.
func TestUncertainRunsAgainAfterLease(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	work, _ := queues(t, conn)
	delay, err := idemamqp.DeclareDelay(channel(t, conn), work, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	cnt := newCounter()
	var runs atomic.Int32
	var firstAt, secondAt time.Time
	const lease = 500 * time.Millisecond
	c, err := idemamqp.New(engine(t, memstore.New(&memstore.Config{SweepInterval: -1}), idem.Config{Lease: lease}),
		&idemamqp.Config{Operation: "uncertain", Delay: delay, Settled: cnt.settled},
		func(ctx context.Context, d amqp.Delivery) error {
			if runs.Add(1) == 1 {
				firstAt = time.Now()
				return idem.Uncertain(errors.New("timeout from the payment provider"))
			}
			secondAt = time.Now()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	run(t, conn, c, work, 1)
	publish(t, channel(t, conn), work, "u", []byte("b"))
	eventually(t, 10*time.Second, "acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", runs.Load())
	}
	if gap := secondAt.Sub(firstAt); gap < lease {
		t.Errorf("ran again after %v, before the lease (%v) ended", gap, lease)
	}
	if n := cnt.action(idemamqp.Delayed); n < 2 || n > 15 {
		t.Errorf("delayed %d times in a %v lease with a 50ms delay", n, lease)
	}
	t.Logf("settlements %v", cnt.actions)
}
