package idemamqp_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// get takes one delivery from queue with basic.get, waiting for the broker
// (another process) to route a publish there.
func get(t testing.TB, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	for i := 0; ; i++ {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return d
		}
		if i == 500 {
			t.Fatal("no message reached the queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runBatch starts c.RunBatch on a channel of its own and stops it at
// cleanup.
func runBatch(t testing.TB, conn *amqp.Connection, c *idemamqp.Consumer, a idemamqp.BatchArgs) {
	t.Helper()
	ch := channel(t, conn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.RunBatch(ctx, ch, a) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunBatch: %v", err)
		}
	})
}

// TestBatchKeysAlone: in one batch, a delivery without a key is rejected
// alone, a terminal error rejects only its own delivery, and a key named
// twice runs the handler once; its second copy answers as a concurrent
// call in one process does (DoBatch): in progress, so tried later, when
// the engine does not wait (Wait 0), and replayed, so acked, when it does.
// Each delivery is settled exactly once, by itself.
func TestBatchKeysAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		dup  idemamqp.Action
	}{{0, idemamqp.Requeued}, {5 * time.Second, idemamqp.Acked}} {
		for _, sk := range stores() {
			t.Run(sk.name+"/wait="+tc.wait.String(), func(t *testing.T) {
				t.Parallel()
				conn := dial(t)
				work, _ := queues(t, conn)
				ch := channel(t, conn)
				for _, id := range []string{"a", "", "a", "declined", "b"} {
					publish(t, ch, work, id, []byte(`{"id":"`+id+`"}`))
				}
				var ds []amqp.Delivery
				for range 5 {
					ds = append(ds, get(t, ch, work))
				}
				var mu sync.Mutex
				runs := map[string]int{}
				c, err := idemamqp.New(engine(t, sk.new(t), idem.Config{Lease: 10 * time.Second, Wait: tc.wait}), &idemamqp.Config{Operation: "keys", Backoff: 10 * time.Millisecond},
					func(ctx context.Context, d amqp.Delivery) error {
						mu.Lock()
						runs[d.MessageId]++
						mu.Unlock()
						if d.MessageId == "declined" {
							return idem.Terminal(errors.New("card declined"), "declined")
						}
						return nil
					})
				if err != nil {
					t.Fatal(err)
				}
				ss := c.HandleBatch(context.Background(), ds, 0)
				want := []idemamqp.Action{idemamqp.Acked, idemamqp.Rejected, tc.dup, idemamqp.Rejected, idemamqp.Acked}
				for i, s := range ss {
					if s.Action != want[i] {
						t.Errorf("delivery %d (%q): %v (%v), want %v", i, ds[i].MessageId, s.Action, s.Err, want[i])
					}
				}
				if !errors.Is(ss[1].Err, consume.ErrNoKey) || ss[1].Verdict.Action != consume.DeadLetter {
					t.Errorf("the keyless one: %v by %v, want consume.ErrNoKey's dead letter", ss[1].Err, ss[1].Verdict.Action)
				}
				if !errors.Is(ss[3].Err, idem.ErrTerminal) {
					t.Errorf("the declined one: %v, want ErrTerminal", ss[3].Err)
				}
				mu.Lock()
				defer mu.Unlock()
				if runs["a"] != 1 || runs["b"] != 1 || runs["declined"] != 1 || len(runs) != 3 {
					t.Errorf("handler runs %v, want one per key", runs)
				}
			})
		}
	}
}

// TestZombieDoesNotAck, through Handle and through HandleBatch: a handler
// stalls past its lease; a copy of its message is handled meanwhile by a
// healthy consumer, which takes the key over and completes. The stalled
// handler's Complete is refused, and its delivery is not acknowledged: its
// verdict is Leave, carried out as for every Leave here (requeued, since an
// unsettled delivery would hold its prefetch slot), and the copy that comes
// back replays the healthy consumer's outcome. In the batch, the other
// delivery is acked by its own verdict.
func TestZombieDoesNotAck(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		batch := pa.batch
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, _ := queues(t, conn)
			ch := channel(t, conn)
			st := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { st.Close() })
			var mu sync.Mutex
			effects := map[string]int{}
			release, started := make(chan struct{}), make(chan struct{})
			var stall atomic.Bool
			stall.Store(true)
			fn := func(ctx context.Context, d amqp.Delivery) error {
				mu.Lock()
				effects[d.MessageId]++
				mu.Unlock()
				if d.MessageId == "z" && stall.CompareAndSwap(true, false) {
					close(started)
					<-release // stalls past its lease
				}
				return nil
			}
			mk := func(owner string) *idemamqp.Consumer {
				c, err := idemamqp.New(engine(t, st, idem.Config{Owner: owner, Lease: time.Second}), &idemamqp.Config{Operation: "zombie", Backoff: 10 * time.Millisecond}, fn)
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			zombie, healthy := mk("zombie"), mk("healthy")
			publish(t, ch, work, "z", []byte("z"))
			first := []amqp.Delivery{get(t, ch, work)}
			if batch {
				publish(t, ch, work, "ok", []byte("ok"))
				first = append(first, get(t, ch, work))
			}
			// A deadline marked EndsAtDeadline gives the claim a lease of
			// that length and no renewal: the zombie loses the key when it
			// passes, as a paused process would.
			zctx, cancel := context.WithTimeout(idem.EndsAtDeadline(context.Background()), 300*time.Millisecond)
			defer cancel()
			done := make(chan []idemamqp.Settlement, 1)
			go func() {
				if batch {
					done <- zombie.HandleBatch(zctx, first, 0)
				} else {
					done <- []idemamqp.Settlement{zombie.Handle(zctx, first[0])}
				}
			}()
			<-started
			<-zctx.Done()
			// The producer's copy, handled by the healthy consumer.
			publish(t, ch, work, "z", []byte("z"))
			if s := healthy.Handle(context.Background(), get(t, ch, work)); s.Action != idemamqp.Acked || s.Replayed {
				t.Fatalf("healthy consumer: %+v; want acked, not replayed", s)
			}
			close(release)
			ss := <-done
			if s := ss[0]; s.Action != idemamqp.Requeued || s.Verdict.Action != consume.Leave || !errors.Is(s.Err, idem.ErrLeaseLost) {
				t.Fatalf("zombie: %v, verdict %v, %v; want requeued by Leave with ErrLeaseLost", s.Action, s.Verdict.Action, s.Err)
			}
			if batch && ss[1].Action != idemamqp.Acked {
				t.Fatalf("the zombie's other delivery: %v, %v; want acked", ss[1].Action, ss[1].Err)
			}
			// The requeued delivery comes back and replays.
			if s := healthy.Handle(context.Background(), get(t, ch, work)); s.Action != idemamqp.Acked || !s.Replayed {
				t.Fatalf("the zombie's delivery again: %+v; want acked as a replay", s)
			}
			mu.Lock()
			defer mu.Unlock()
			if effects["z"] != 2 {
				t.Fatalf("effects %v; want z twice (the zombie's, which the store could not record, and the takeover's)", effects)
			}
		})
	}
}

func TestRunBatchRefused(t *testing.T) {
	t.Parallel()
	conn := dial(t)
	ch := channel(t, conn)
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	c, err := idemamqp.New(engine(t, st, idem.Config{}), &idemamqp.Config{Operation: "x"}, func(context.Context, amqp.Delivery) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]idemamqp.BatchArgs{
		"auto-ack":          {ConsumeArgs: idemamqp.ConsumeArgs{Queue: "q", AutoAck: true}},
		"no queue":          {},
		"negative size":     {ConsumeArgs: idemamqp.ConsumeArgs{Queue: "q"}, Size: -1},
		"negative window":   {ConsumeArgs: idemamqp.ConsumeArgs{Queue: "q"}, Window: -time.Second},
		"negative batches":  {ConsumeArgs: idemamqp.ConsumeArgs{Queue: "q"}, Batches: -1},
		"negative handlers": {ConsumeArgs: idemamqp.ConsumeArgs{Queue: "q", Concurrency: -1}},
	} {
		if err := c.RunBatch(context.Background(), ch, a); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestBatchSettlesEachOnItsOwnOutcome: a delivery is acked as soon as its
// own outcome is recorded, not at the pace of its batch's slowest: the
// second delivery's handler runs until the first has been acked, its
// outcome recorded in the store.
func TestBatchSettlesEachOnItsOwnOutcome(t *testing.T) {
	t.Parallel()
	for _, sk := range stores() {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			conn := dial(t)
			work, _ := queues(t, conn)
			ch := channel(t, conn)
			for _, id := range []string{"fast", "slow"} {
				publish(t, ch, work, id, []byte(`{"id":"`+id+`"}`))
			}
			ds := []amqp.Delivery{get(t, ch, work), get(t, ch, work)}
			fastAcked := make(chan struct{})
			e := engine(t, sk.new(t), idem.Config{Lease: 10 * time.Second})
			c, err := idemamqp.New(e, &idemamqp.Config{Operation: "each",
				Settled: func(d amqp.Delivery, s idemamqp.Settlement) {
					if d.MessageId == "fast" && s.Action == idemamqp.Acked && s.Err == nil {
						close(fastAcked)
					}
				}},
				func(ctx context.Context, d amqp.Delivery) error {
					if d.MessageId != "slow" {
						return nil
					}
					select {
					case <-fastAcked:
					case <-time.After(30 * time.Second):
						return errors.New("the first delivery was not acked while the second ran")
					}
					id, err := (&idem.Request{Operation: "each", Key: "fast"}).Identity()
					if err != nil {
						return err
					}
					if st, err := e.Status(ctx, id.StoreKey); err != nil || st.Status != idem.StatusCompleted {
						return errors.New("acked before its outcome was recorded")
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			ss := c.HandleBatch(context.Background(), ds, 0)
			for i, s := range ss {
				if s.Action != idemamqp.Acked || s.Err != nil {
					t.Errorf("delivery %d (%q): %v (%v), want acked", i, ds[i].MessageId, s.Action, s.Err)
				}
			}
		})
	}
}
