package idemnats_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

const killAckWait = time.Second

// killStore is the Redis store the child and the parent share.
func killStore(t testing.TB, prefix string) *idem.Engine {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	st, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return newEngine(t, st, idem.Config{Lease: killAckWait})
}

// blockingAck never acks: the child is killed while "acking".
type blockingAck struct{ jetstream.Msg }

func (b blockingAck) Ack() error {
	fmt.Println("COMPLETED")
	select {}
}

// killOrders is how many messages one run of the path takes: one alone,
// killBatchOrders in a batch.
func (p path) killOrders() int {
	if p.batch {
		return killBatchOrders
	}
	return 1
}

const killBatchOrders = 4

// TestKillChild is the consumer process TestKillMidHandler runs and kills:
// it takes killOrders messages through its path (IDEMNATS_KILL_PATH).
func TestKillChild(t *testing.T) {
	stage := os.Getenv("IDEMNATS_KILL_STAGE")
	if stage == "" {
		t.Skip("run by TestKillMidHandler")
	}
	pa := pathNamed(t, os.Getenv("IDEMNATS_KILL_PATH"))
	nc, err := nats.Connect(os.Getenv("IDEMNATS_KILL_URL"))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(context.Background(), os.Getenv("IDEMNATS_KILL_STREAM"), "kill")
	if err != nil {
		t.Fatal(err)
	}
	p := pa.wrap(t, killStore(t, os.Getenv("IDEMNATS_KILL_PREFIX")), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			order := m.Headers().Get("Order-Id")
			fmt.Println("RAN " + order)
			if stage == "handler" && order == "order-0" {
				select {} // killed here, mid-handler, the others (in a batch) done
			}
			return struct{}{}, nil
		})
	var msgs []jetstream.Msg
	for len(msgs) < pa.killOrders() {
		for _, m := range fetchN(t, cons, pa.killOrders()-len(msgs), 5*time.Second) {
			msgs = append(msgs, blockingAck{m})
		}
	}
	p(context.Background(), msgs)
	select {}
}

// TestKillMidHandler: a consumer process is SIGKILLed mid-handler, or after
// its outcome was recorded but before its ack; the redelivery runs the
// handler again only in the first case. On the batch path the process is
// killed mid-batch — with one handler still running and the others'
// outcomes recorded, or after every outcome was recorded and while each
// message's ack (made as soon as its own outcome landed) is under way —
// and the redeliveries, handled through the batch path, run again only the
// handler that was cut off.
func TestKillMidHandler(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		for _, stage := range []string{"handler", "ack"} {
			t.Run(pa.name+"/killed in "+stage, func(t *testing.T) {
				t.Parallel()
				js, s, subj := stream(t)
				ctx := context.Background()
				n := pa.killOrders()
				for i := range n {
					publish(t, js, subj, "order-"+strconv.Itoa(i), 0)
				}
				if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "kill", AckPolicy: jetstream.AckExplicitPolicy, AckWait: killAckWait}); err != nil {
					t.Fatal(err)
				}
				prefix := fmt.Sprintf("idemnats-kill-%d:", rand.Uint64())
				eng := killStore(t, prefix)
				cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
				cmd.Env = append(os.Environ(), "IDEMNATS_KILL_STAGE="+stage, "IDEMNATS_KILL_PATH="+pa.name, "IDEMNATS_KILL_URL="+js.Conn().ConnectedUrl(),
					"IDEMNATS_KILL_STREAM="+s.CachedInfo().Config.Name, "IDEMNATS_KILL_PREFIX="+prefix)
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
					if strings.HasPrefix(sc.Text(), "RAN ") {
						ran++
					}
					if strings.Contains(sc.Text(), "COMPLETED") {
						acking++ // each message is acked on its own outcome
					}
					// A batch's answers are made by the goroutine that writes
					// its outcomes, one after another: the first ack, which
					// never returns here, holds up the others.
					if stage == "handler" && ran == n || stage == "ack" && ran == n && acking > 0 {
						break
					}
				}
				{
					// Kill once the finished handlers' outcomes are recorded
					// (every one's, when killed in an ack).
					first := 1
					if stage == "ack" {
						first = 0
					}
					deadline := time.Now().Add(10 * time.Second)
					for i := first; i < n; {
						req := idem.Request{Operation: "ship", Key: "order-" + strconv.Itoa(i)}
						id, err := req.Identity()
						if err != nil {
							t.Fatal(err)
						}
						if st, err := eng.Status(ctx, id.StoreKey); err == nil && st.Status == idem.StatusCompleted {
							i++
							continue
						}
						if time.Now().After(deadline) {
							t.Fatalf("order-%d never recorded by the child", i)
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				cmd.Process.Kill() // SIGKILL
				cmd.Wait()
				if ran != n {
					t.Fatalf("the child ran %d handlers, want %d", ran, n)
				}

				cons, _ := s.Consumer(ctx, "kill")
				var mu sync.Mutex
				runs := map[string]int{}
				p := pa.wrap(t, eng, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
					func(_ context.Context, m jetstream.Msg) (struct{}, error) {
						mu.Lock()
						runs[m.Headers().Get("Order-Id")]++
						mu.Unlock()
						return struct{}{}, nil
					})
				// Redelivered after AckWait (in batches on the batch path);
				// while the dead child's lease lasts order-0 is nakked with a
				// delay, then handled.
				acked := map[string]bool{}
				deadline := time.Now().Add(15 * time.Second)
				for len(acked) < n {
					if time.Now().After(deadline) {
						t.Fatalf("only %v acked after the kill", acked)
					}
					msgs := fetchN(t, cons, n, 5*time.Second)
					ds, _ := p(ctx, msgs)
					for i, d := range ds {
						if d == idemnats.Acked {
							acked[msgs[i].Headers().Get("Order-Id")] = true
						}
					}
				}
				want := map[string]int{}
				if stage == "handler" {
					want["order-0"] = 1
				}
				mu.Lock()
				defer mu.Unlock()
				if fmt.Sprint(runs) != fmt.Sprint(want) {
					t.Fatalf("handlers ran %v after the kill, want %v", runs, want)
				}
			})
		}
	}
}
