package idemkafka_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
)

// killLease is the lease of the engines of the kill and zombie tests: a
// dead or stopped consumer's claim is taken over this long after its last
// renewal.
const killLease = time.Second

const killOrders = 4

func killEngine(t testing.TB, prefix string) *idem.Engine {
	return newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease})
}

func orderKey(r *kgo.Record) (string, error) { return string(r.Key), nil }

// TestKillChild is the consumer process TestKillMidBatch and
// TestZombieConsumer run: a Consumer of IDEMKAFKA_GROUP on IDEMKAFKA_TOPIC
// at IDEMKAFKA_BROKERS, over the real Redis under IDEMKAFKA_PREFIX. It
// prints "RAN <key>" as each handler begins and "SETTLED <key> <verdict>"
// as each record is settled, and then:
//   - stage "handler": blocks in order-2's handler (order-0 and order-1
//     are recorded, order-3 not begun), to be killed there;
//   - stage "commit": blocks once every record is settled, before the
//     batch's offsets are committed, to be killed there;
//   - stage "zombie": blocks in order-0's handler until a line comes on
//     its standard input (it is stopped and continued meanwhile), then
//     returns.
func TestKillChild(t *testing.T) {
	stage := os.Getenv("IDEMKAFKA_STAGE")
	if stage == "" {
		t.Skip("run by TestKillMidBatch and TestZombieConsumer")
	}
	seeds := strings.Split(os.Getenv("IDEMKAFKA_BROKERS"), ",")
	tp := os.Getenv("IDEMKAFKA_TOPIC")
	var out sync.Mutex
	say := func(s string) { out.Lock(); fmt.Println(s); out.Unlock() }
	stdin := bufio.NewReader(os.Stdin)
	c, err := idemkafka.New(killEngine(t, os.Getenv("IDEMKAFKA_PREFIX")), &idemkafka.Config{
		Operation: "ship", Key: orderKey,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			say(fmt.Sprintf("SETTLED %s %s", r.Key, v.Action))
			if stage == "commit" && r.Offset == killOrders-1 {
				select {} // killed here, before the commit
			}
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		say("RAN " + string(r.Key))
		switch {
		case stage == "handler" && string(r.Key) == "order-2":
			select {} // killed here, mid-batch
		case stage == "zombie" && string(r.Key) == "order-0":
			if _, err := stdin.ReadString('\n'); err != nil && err != io.EOF {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}, groupOpts(seeds, os.Getenv("IDEMKAFKA_GROUP"), tp)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// child starts TestKillChild for stage.
func child(t *testing.T, stage string, seeds []string, group, tp, prefix string) *childproc.Child {
	return childproc.Start(t, "TestKillChild", "IDEMKAFKA_STAGE="+stage, "IDEMKAFKA_BROKERS="+strings.Join(seeds, ","),
		"IDEMKAFKA_TOPIC="+tp, "IDEMKAFKA_GROUP="+group, "IDEMKAFKA_PREFIX="+prefix)
}

// recorded reports whether key's outcome is recorded as COMPLETED.
func recorded(t testing.TB, e *idem.Engine, key string) bool {
	req := idem.Request{Operation: "ship", Key: key}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Status(context.Background(), id.StoreKey)
	return err == nil && st.Status == idem.StatusCompleted
}

// TestKillMidBatch: a consumer process is SIGKILLed mid-batch — with
// order-2's handler running, order-0 and order-1 recorded and order-3 not
// begun, or with every outcome recorded and the batch's offsets not yet
// committed. A consumer that takes the partition over after the dead
// one's session ended runs again only what had not run to its end
// (order-2, after the dead holder's lease, and order-3), and commits to
// the end.
func TestKillMidBatch(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"handler", "commit"} {
		t.Run("killed in "+stage, func(t *testing.T) {
			t.Parallel()
			seeds := brokers(t)
			tp := topic(t, seeds, 1)
			var recs []*kgo.Record
			for i := range killOrders {
				recs = append(recs, keyed(tp, 0, "order-"+strconv.Itoa(i)))
			}
			produce(t, seeds, recs...)
			group := "g-" + tp
			prefix := fmt.Sprintf("idemkafka-kill-%d:", rand.Uint64())
			eng := killEngine(t, prefix)

			ch := child(t, stage, seeds, group, tp, prefix)
			if stage == "handler" {
				ch.WaitLine(t, "RAN order-2")
				waitFor(t, 10*time.Second, "order-0 and order-1 recorded", func() bool {
					return recorded(t, eng, "order-0") && recorded(t, eng, "order-1")
				})
			} else {
				ch.WaitLine(t, "SETTLED order-3 done")
			}
			_ = ch.Cmd.Process.Kill() // SIGKILL
			_ = ch.Cmd.Wait()
			if got := committed(t, seeds, group, tp, 0); got != -1 {
				t.Fatalf("the killed consumer committed %d", got)
			}

			var (
				mu   sync.Mutex
				runs = map[string]int{}
			)
			c, err := idemkafka.New(eng, &idemkafka.Config{Operation: "ship", Key: orderKey},
				func(_ context.Context, r *kgo.Record) (struct{}, error) {
					mu.Lock()
					runs[string(r.Key)]++
					mu.Unlock()
					return struct{}{}, nil
				}, groupOpts(seeds, group, tp)...)
			if err != nil {
				t.Fatal(err)
			}
			start(t, c)
			waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return committed(t, seeds, group, tp, 0) == killOrders })
			want := map[string]int{}
			if stage == "handler" {
				want = map[string]int{"order-2": 1, "order-3": 1}
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(runs) != fmt.Sprint(want) {
				t.Fatalf("handlers ran %v after the kill, want %v", runs, want)
			}
		})
	}
}

// TestZombieConsumer: a consumer process stops (SIGSTOP) in order-0's
// handler; the group's session ends, its partition goes to another
// consumer, which takes order-0's key over once the stopped one's lease
// has run out, runs it and commits. The stopped consumer, continued, ends
// its handler: its outcome write is refused (consume.Leave), and it
// commits nothing past what the new owner did.
func TestZombieConsumer(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp := topic(t, seeds, 1)
	produce(t, seeds, keyed(tp, 0, "order-0"))
	group := "g-" + tp
	prefix := fmt.Sprintf("idemkafka-zombie-%d:", rand.Uint64())
	eng := killEngine(t, prefix)

	z := child(t, "zombie", seeds, group, tp, prefix)
	z.WaitLine(t, "RAN order-0")
	if err := z.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		runs int
	)
	c, err := idemkafka.New(eng, &idemkafka.Config{Operation: "ship", Key: orderKey},
		func(context.Context, *kgo.Record) (struct{}, error) {
			mu.Lock()
			runs++
			mu.Unlock()
			return struct{}{}, nil
		}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, 30*time.Second, "the new owner's commit", func() bool { return committed(t, seeds, group, tp, 0) == 1 })
	mu.Lock()
	if runs != 1 {
		t.Errorf("the new owner ran order-0 %d times, want 1", runs)
	}
	mu.Unlock()

	if err := z.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(z.In, "go\n"); err != nil {
		t.Fatal(err)
	}
	z.WaitLine(t, "SETTLED order-0 leave")
	// The zombie's batch is over: whatever it commits now is not past 1.
	_ = z.Cmd.Process.Kill()
	_ = z.Cmd.Wait()
	if got := committed(t, seeds, group, tp, 0); got != 1 {
		t.Errorf("committed %d after the zombie's batch, want 1", got)
	}
}
