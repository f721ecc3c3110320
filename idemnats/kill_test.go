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
	"sync/atomic"
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

// TestKillChild is the consumer process TestKillMidHandler runs and kills.
func TestKillChild(t *testing.T) {
	stage := os.Getenv("IDEMNATS_KILL_STAGE")
	if stage == "" {
		t.Skip("run by TestKillMidHandler")
	}
	nc, err := nats.Connect(os.Getenv("IDEMNATS_KILL_URL"))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(context.Background(), os.Getenv("IDEMNATS_KILL_STREAM"), "kill")
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemnats.Wrap(killStore(t, os.Getenv("IDEMNATS_KILL_PREFIX")), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			fmt.Println("RAN")
			if stage == "handler" {
				select {} // killed here, mid-handler
			}
			return struct{}{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	m := fetchOne(t, cons, 5*time.Second)
	p(context.Background(), blockingAck{m})
	select {}
}

// TestKillMidHandler: a consumer process is SIGKILLed mid-handler, or after
// its outcome was recorded but before its ack; the redelivery runs the
// handler again only in the first case.
func TestKillMidHandler(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"handler", "ack"} {
		t.Run("killed in "+stage, func(t *testing.T) {
			t.Parallel()
			js, s, subj := stream(t)
			ctx := context.Background()
			publish(t, js, subj, "order-k", 0)
			if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "kill", AckPolicy: jetstream.AckExplicitPolicy, AckWait: killAckWait}); err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("idemnats-kill-%d:", rand.Uint64())
			eng := killStore(t, prefix)
			cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
			cmd.Env = append(os.Environ(), "IDEMNATS_KILL_STAGE="+stage, "IDEMNATS_KILL_URL="+js.Conn().ConnectedUrl(),
				"IDEMNATS_KILL_STREAM="+s.CachedInfo().Config.Name, "IDEMNATS_KILL_PREFIX="+prefix)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			want := "RAN"
			if stage == "ack" {
				want = "COMPLETED"
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() && !strings.Contains(sc.Text(), want) {
			}
			cmd.Process.Kill() // SIGKILL
			cmd.Wait()

			cons, _ := s.Consumer(ctx, "kill")
			var runs atomic.Int32
			p, err := idemnats.Wrap(eng, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
				func(context.Context, jetstream.Msg) (struct{}, error) { runs.Add(1); return struct{}{}, nil })
			if err != nil {
				t.Fatal(err)
			}
			// Redelivered after AckWait; while the dead child's lease
			// lasts it is nakked with a delay, then handled.
			deadline := time.Now().Add(15 * time.Second)
			for {
				if time.Now().After(deadline) {
					t.Fatal("never acked after the kill")
				}
				m := fetchOne(t, cons, 5*time.Second)
				if d, _ := p(ctx, m); d == idemnats.Acked {
					break
				}
			}
			wantRuns := int32(1)
			if stage == "ack" {
				wantRuns = 0
			}
			if runs.Load() != wantRuns {
				t.Fatalf("handler ran %d times after the kill, want %d", runs.Load(), wantRuns)
			}
		})
	}
}

const killBatchOrders = 4

// TestKillBatchChild is the consumer process TestKillMidBatch runs and
// kills: it takes one batch of killBatchOrders messages through WrapBatch.
func TestKillBatchChild(t *testing.T) {
	stage := os.Getenv("IDEMNATS_KILL_BATCH_STAGE")
	if stage == "" {
		t.Skip("run by TestKillMidBatch")
	}
	nc, err := nats.Connect(os.Getenv("IDEMNATS_KILL_URL"))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	cons, err := js.Consumer(context.Background(), os.Getenv("IDEMNATS_KILL_STREAM"), "kill")
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemnats.WrapBatch(killStore(t, os.Getenv("IDEMNATS_KILL_PREFIX")), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			order := m.Headers().Get("Order-Id")
			fmt.Println("RAN " + order)
			if stage == "handler" && order == "order-0" {
				select {} // killed here, mid-handler, the others done
			}
			return struct{}{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for len(msgs) < killBatchOrders {
		for _, m := range fetchN(t, cons, killBatchOrders-len(msgs), 5*time.Second) {
			msgs = append(msgs, blockingAck{m})
		}
	}
	p(context.Background(), msgs)
	select {}
}

// TestKillMidBatch: a consumer process is SIGKILLed mid-batch — with one
// handler still running and the others' outcomes recorded, or after every
// outcome was recorded and while each message's ack (made as soon as its
// own outcome landed) is under way. The redeliveries, handled
// through the batch path, run again only the handler that was cut off.
func TestKillMidBatch(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"handler", "ack"} {
		t.Run("killed in "+stage, func(t *testing.T) {
			t.Parallel()
			js, s, subj := stream(t)
			ctx := context.Background()
			for i := range killBatchOrders {
				publish(t, js, subj, "order-"+strconv.Itoa(i), 0)
			}
			if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "kill", AckPolicy: jetstream.AckExplicitPolicy, AckWait: killAckWait}); err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("idemnats-kill-%d:", rand.Uint64())
			eng := killStore(t, prefix)
			cmd := exec.Command(os.Args[0], "-test.run=^TestKillBatchChild$", "-test.v")
			cmd.Env = append(os.Environ(), "IDEMNATS_KILL_BATCH_STAGE="+stage, "IDEMNATS_KILL_URL="+js.Conn().ConnectedUrl(),
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
				if stage == "handler" && ran == killBatchOrders || stage == "ack" && acking == killBatchOrders {
					break
				}
			}
			if stage == "handler" {
				// Kill once the finished handlers' outcomes are recorded.
				deadline := time.Now().Add(10 * time.Second)
				for i := 1; i < killBatchOrders; {
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
			if ran != killBatchOrders {
				t.Fatalf("the child ran %d handlers, want %d", ran, killBatchOrders)
			}

			cons, _ := s.Consumer(ctx, "kill")
			var mu sync.Mutex
			runs := map[string]int{}
			p, err := idemnats.WrapBatch(eng, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: killAckWait},
				func(_ context.Context, m jetstream.Msg) (struct{}, error) {
					mu.Lock()
					runs[m.Headers().Get("Order-Id")]++
					mu.Unlock()
					return struct{}{}, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			// Redelivered after AckWait, in batches; while the dead
			// child's lease lasts order-0 is nakked with a delay, then
			// handled.
			acked := map[string]bool{}
			deadline := time.Now().Add(15 * time.Second)
			for len(acked) < killBatchOrders {
				if time.Now().After(deadline) {
					t.Fatalf("only %v acked after the kill", acked)
				}
				msgs := fetchN(t, cons, killBatchOrders, 5*time.Second)
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
