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
	envChildPath   = "IDEMAMQP_CHILD_PATH" // "single" or "batch"
	killLease      = time.Second
)

// blockingAck stands for a process that dies after the engine recorded
// COMPLETED and before its Ack reached the broker.
type blockingAck struct{ amqp.Acknowledger }

func (blockingAck) Ack(uint64, bool) error {
	fmt.Println("completed")
	select {}
}

// killOrders is how many deliveries one run of the path takes: one alone,
// killBatchSize in a batch.
func (p path) killOrders() int {
	if p.batch {
		return killBatchSize
	}
	return 1
}

const killBatchSize = 4

// TestChildConsumer is the child of TestSIGKILL: it collects killOrders
// deliveries and handles them on its path (IDEMAMQP_CHILD_PATH).
func TestChildConsumer(t *testing.T) {
	queue := os.Getenv(envChildQueue)
	if queue == "" {
		t.Skip("the child consumer of TestSIGKILL")
	}
	pa := pathNamed(t, os.Getenv(envChildPath))
	mode := os.Getenv(envChildMode)
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
				select {} // killed here, the others (in a batch) done
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(pa.killOrders(), 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var batch []amqp.Delivery
	for d := range ds {
		d.Acknowledger = blockingAck{d.Acknowledger}
		if batch = append(batch, d); len(batch) == pa.killOrders() {
			break
		}
	}
	pa.handle(ctx, c, batch)
	select {}
}

// TestSIGKILL: a consumer killed (SIGKILL) in its handler: the message is
// redelivered and handled once more after the lease. A consumer killed
// after its handler completed but before the Ack: the message is
// redelivered and replayed, never handled twice. On the batch path the
// consumer is killed with one handler of its batch still running and the
// others' outcomes recorded, or after every outcome was recorded and while
// each delivery's Ack (made as soon as its own outcome landed) is under
// way; the redeliveries, handled by RunBatch, run again only the handler
// that was cut off.
func TestSIGKILL(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		for _, mode := range []string{"in-handler", "before-ack"} {
			t.Run(pa.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				n := pa.killOrders()
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
				for i := range n {
					publish(t, pub, work, "k-"+strconv.Itoa(i), []byte("payload "+strconv.Itoa(i)))
				}
				s, err := redisstore.New(rc, &redisstore.Config{Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				eng := engine(t, s, idem.Config{Lease: killLease, Owner: "survivor"})

				cmd := exec.Command(os.Args[0], "-test.run", "^TestChildConsumer$", "-test.v")
				cmd.Env = append(os.Environ(), envChildQueue+"="+work, envChildPrefix+"="+prefix, envChildMode+"="+mode, envChildPath+"="+pa.name)
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
					// A batch's answers are made by the goroutine that writes
					// its outcomes, one after another: the first ack, which
					// never returns here, holds up the others.
					if mode == "in-handler" && ran == n || mode == "before-ack" && ran == n && acking > 0 {
						break
					}
				}
				{
					// Kill once the finished handlers' outcomes are recorded
					// (every one's, when killed before an ack).
					first := 1
					if mode == "before-ack" {
						first = 0
					}
					for i := first; i < n; i++ {
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
				if ran != n {
					t.Fatalf("the child ran %d handlers, want %d", ran, n)
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
				if pa.batch {
					runBatch(t, conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: work}, Size: n})
				} else {
					run(t, conn, c, work, 1)
				}
				eventually(t, 10*time.Second, "every redelivery acknowledged", func() bool { return cnt.action(idemamqp.Acked) == n })
				want := map[string]int{}
				if mode == "in-handler" {
					want["k-0"] = 1
				}
				mu.Lock()
				defer mu.Unlock()
				if fmt.Sprint(runs) != fmt.Sprint(want) {
					t.Errorf("handlers ran %v after the kill, want %v (settlements %v)", runs, want, cnt.actions)
				}
				t.Logf("child ran %d, after the kill %v, settlements %v", ran, runs, cnt.actions)
			})
		}
	}
}
