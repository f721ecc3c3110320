package idemamqp_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// The child consumer: TestSIGKILL re-runs the test binary with these set.
const (
	envChildQueue  = "IDEMAMQP_CHILD_QUEUE"
	envChildPrefix = "IDEMAMQP_CHILD_PREFIX"
	envChildMode   = "IDEMAMQP_CHILD_MODE" // "in-handler" or "before-ack"
	killLease      = time.Second
)

// blockingAck stands for a process that dies after the engine recorded
// COMPLETED and before its Ack reached the broker.
type blockingAck struct{ amqp.Acknowledger }

func (blockingAck) Ack(uint64, bool) error {
	fmt.Println("completed")
	select {}
}

func TestChildConsumer(t *testing.T) {
	queue := os.Getenv(envChildQueue)
	if queue == "" {
		t.Skip("the child consumer of TestSIGKILL")
	}
	ctx := context.Background()
	conn := dial(t)
	ch := channel(t, conn)
	s, err := redisstore.New(redis.NewClient(&redis.Options{Addr: testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")}),
		&redisstore.Config{Prefix: os.Getenv(envChildPrefix)})
	if err != nil {
		t.Fatal(err)
	}
	mode := os.Getenv(envChildMode)
	c, err := idemamqp.New(engine(t, s, idem.Config{Lease: killLease, Owner: "child"}), &idemamqp.Config{Operation: "kill"},
		func(ctx context.Context, d amqp.Delivery) error {
			if mode == "in-handler" {
				fmt.Println("started")
				select {}
			}
			fmt.Println("effect")
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for d := range ds {
		d.Acknowledger = blockingAck{d.Acknowledger}
		c.Handle(ctx, d)
	}
}

// A consumer killed (SIGKILL) in its handler: the message is redelivered
// and handled once more after the lease. A consumer killed after its
// handler completed but before the Ack: the message is redelivered and
// replayed, never handled twice.
func TestSIGKILL(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"in-handler", "before-ack"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, _ := queues(t, conn)
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			rc := redis.NewClient(&redis.Options{Addr: addr})
			prefix := fmt.Sprintf("idemamqp-kill:%s:", work)
			t.Cleanup(func() {
				ctx := context.Background()
				it := rc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
				for it.Next(ctx) {
					rc.Del(ctx, it.Val())
				}
				rc.Close()
			})
			publish(t, channel(t, conn), work, "k-1", []byte("payload"))

			cmd := exec.Command(os.Args[0], "-test.run", "^TestChildConsumer$", "-test.v")
			cmd.Env = append(os.Environ(), envChildQueue+"="+work, envChildPrefix+"="+prefix, envChildMode+"="+mode)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			childEffects := 0
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				if line == "effect" {
					childEffects++
				}
				if line == "started" || line == "completed" {
					break
				}
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			s, err := redisstore.New(rc, &redisstore.Config{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			var effects atomic.Int32
			cnt := newCounter()
			c, err := idemamqp.New(engine(t, s, idem.Config{Lease: killLease, Owner: "survivor"}),
				&idemamqp.Config{Operation: "kill", Backoff: 100 * time.Millisecond, Settled: cnt.settled},
				func(ctx context.Context, d amqp.Delivery) error { effects.Add(1); return nil })
			if err != nil {
				t.Fatal(err)
			}
			run(t, conn, c, work, 1)
			eventually(t, 10*time.Second, "the redelivery acknowledged", func() bool { return cnt.action(idemamqp.Acked) == 1 })
			total := childEffects + int(effects.Load())
			if total != 1 {
				t.Errorf("effects: %d in the killed child, %d after; want 1 in all", childEffects, effects.Load())
			}
			t.Logf("child effects %d, survivor effects %d, settlements %v", childEffects, effects.Load(), cnt.actions)
		})
	}
}

const killBatchSize = 4

// TestChildBatchConsumer is the child of TestSIGKILLBatch: it collects one
// batch of killBatchSize deliveries and handles it with HandleBatch.
func TestChildBatchConsumer(t *testing.T) {
	queue := os.Getenv(envChildQueue)
	mode := os.Getenv(envChildMode)
	if queue == "" || os.Getenv("IDEMAMQP_CHILD_BATCH") == "" {
		t.Skip("the child consumer of TestSIGKILLBatch")
	}
	ctx := context.Background()
	conn := dial(t)
	ch := channel(t, conn)
	s, err := redisstore.New(redis.NewClient(&redis.Options{Addr: testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")}),
		&redisstore.Config{Prefix: os.Getenv(envChildPrefix)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemamqp.New(engine(t, s, idem.Config{Lease: killLease, Owner: "child"}), &idemamqp.Config{Operation: "kill"},
		func(ctx context.Context, d amqp.Delivery) error {
			fmt.Println("ran " + d.MessageId)
			if mode == "in-handler" && d.MessageId == "k-0" {
				select {} // killed here, the others done
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(killBatchSize, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var batch []amqp.Delivery
	for d := range ds {
		d.Acknowledger = blockingAck{d.Acknowledger}
		if batch = append(batch, d); len(batch) == killBatchSize {
			break
		}
	}
	c.HandleBatch(ctx, batch, 0)
	select {}
}

// TestSIGKILLBatch: a batch consumer killed (SIGKILL) with one handler of
// its batch still running and the others' outcomes recorded, or after
// every outcome was recorded and while each delivery's Ack (made as soon
// as its own outcome landed) is under way. The redeliveries,
// handled by RunBatch, run again only the handler that was cut off.
func TestSIGKILLBatch(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"in-handler", "before-ack"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, _ := queues(t, conn)
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			rc := redis.NewClient(&redis.Options{Addr: addr})
			prefix := fmt.Sprintf("idemamqp-kill:%s:", work)
			t.Cleanup(func() {
				ctx := context.Background()
				it := rc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
				for it.Next(ctx) {
					rc.Del(ctx, it.Val())
				}
				rc.Close()
			})
			pub := channel(t, conn)
			for i := range killBatchSize {
				publish(t, pub, work, "k-"+strconv.Itoa(i), []byte("payload "+strconv.Itoa(i)))
			}
			s, err := redisstore.New(rc, &redisstore.Config{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			eng := engine(t, s, idem.Config{Lease: killLease, Owner: "survivor"})

			cmd := exec.Command(os.Args[0], "-test.run", "^TestChildBatchConsumer$", "-test.v")
			cmd.Env = append(os.Environ(), envChildQueue+"="+work, envChildPrefix+"="+prefix, envChildMode+"="+mode, "IDEMAMQP_CHILD_BATCH=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ran, acking := 0, 0
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				if strings.HasPrefix(line, "ran ") {
					ran++
				}
				if line == "completed" {
					acking++ // each delivery is acked on its own outcome
				}
				if mode == "in-handler" && ran == killBatchSize || mode == "before-ack" && acking == killBatchSize {
					break
				}
			}
			if mode == "in-handler" {
				// Kill once the finished handlers' outcomes are recorded.
				for i := 1; i < killBatchSize; i++ {
					req := idem.Request{Operation: "kill", Key: "k-" + strconv.Itoa(i)}
					id, err := req.Identity()
					if err != nil {
						t.Fatal(err)
					}
					eventually(t, 10*time.Second, "k-"+strconv.Itoa(i)+" recorded by the child", func() bool {
						st, err := eng.Status(context.Background(), id.StoreKey)
						return err == nil && st.Status == idem.StatusCompleted
					})
				}
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if ran != killBatchSize {
				t.Fatalf("the child ran %d handlers, want %d", ran, killBatchSize)
			}

			var mu sync.Mutex
			runs := map[string]int{}
			cnt := newCounter()
			c, err := idemamqp.New(eng, &idemamqp.Config{Operation: "kill", Backoff: 100 * time.Millisecond, Settled: cnt.settled},
				func(ctx context.Context, d amqp.Delivery) error {
					mu.Lock()
					runs[d.MessageId]++
					mu.Unlock()
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			runBatch(t, conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: work}, Size: killBatchSize})
			eventually(t, 10*time.Second, "every redelivery acknowledged", func() bool { return cnt.action(idemamqp.Acked) == killBatchSize })
			want := map[string]int{}
			if mode == "in-handler" {
				want["k-0"] = 1
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(runs) != fmt.Sprint(want) {
				t.Errorf("handlers ran %v after the kill, want %v (settlements %v)", runs, want, cnt.actions)
			}
		})
	}
}
