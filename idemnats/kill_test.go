package idemnats_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

const killAckWait = consumetest.KillLease

// blockingAck never acks: the child is killed while "acking".
type blockingAck struct {
	jetstream.Msg
	c *consumetest.ChildConsumer
}

func (b blockingAck) Ack() error {
	b.c.Acking(b.Headers().Get("Order-Id"))
	return nil
}

// killConfig is how one run of the path takes its messages: one alone, or
// four in a batch, whose handlers run at once.
func (p path) killConfig() consumetest.KillConfig {
	if p.batch {
		return consumetest.KillConfig{Orders: 4}
	}
	return consumetest.KillConfig{Orders: 1}
}

// TestKillChild is the consumer process consumetest.KillMidHandler,
// consumetest.ZombieHandler and consumetest.KillBetweenSteps run: it takes
// the path's (IDEMNATS_KILL_PATH) messages (one, for ZombieHandler and
// KillBetweenSteps) from the durable consumer "kill" of
// IDEMNATS_KILL_STREAM, never acks them, and says how it settled them.
func TestKillChild(t *testing.T) {
	c := consumetest.KillChild(t, sharedStore)
	if c == nil {
		t.Skip("run by TestKillMidHandler, TestZombieHandler and TestKillBetweenSteps")
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
	p := pa.wrap(t, c.Engine, &idemnats.Config{Operation: consumetest.KillOperation, Key: orderKey, AckWait: killAckWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			return struct{}{}, c.Handle(ctx, m.Headers().Get("Order-Id"))
		})
	n := pa.killConfig().Orders
	if c.Single() {
		n = 1
	}
	var msgs []jetstream.Msg
	for len(msgs) < n {
		for _, m := range fetchN(t, cons, n-len(msgs), 5*time.Second) {
			msgs = append(msgs, blockingAck{m, c})
		}
	}
	ds, errs := p(context.Background(), msgs)
	for i, d := range ds {
		c.Settled(msgs[i].Headers().Get("Order-Id"), verdictOf(d, errs[i]))
	}
	select {}
}

// TestKillMidHandler: consumetest's kill scenario on each path (Process, or
// ProcessBatch with four messages in a batch): a consumer process is
// SIGKILLed mid-handler (in a batch, with the others' outcomes recorded),
// or after every outcome was recorded and while an ack is under way; the
// redeliveries (in batches on the batch path; while the dead child's lease
// lasts nakked with a delay) run again only the handler that was cut off.
func TestKillMidHandler(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillMidHandler(t, sharedStore, pa.killConfig(), func(t *testing.T) consumetest.Killable {
				return newNatsKillable(t, pa)
			})
		})
	}
}

// TestZombieHandler: consumetest's zombie scenario on each path. A
// consumer process stops (SIGSTOP) in order-0's handler; after AckWait the
// message is redelivered to another consumer, which delays it while the
// stopped one's lease lasts, then takes the key over, runs it and acks.
// The stopped consumer, continued, ends its handler: its effect is refused
// downstream, its outcome write is refused and it leaves the message
// unacked (consume.Leave).
func TestZombieHandler(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.ZombieHandler(t, sharedStore, func(t *testing.T) consumetest.Stoppable {
				return newNatsKillable(t, pa)
			})
		})
	}
}

// TestKillBetweenSteps: consumetest's steps scenario on each path (on the
// batch path, a batch of one, run by DoBatch). A consumer process is
// SIGKILLed between the second and third steps of its handler; after
// AckWait the message is redelivered to another consumer, which delays it
// while the dead one's lease lasts, then takes the key over, resumes after
// the two recorded steps (running only the third) and acks.
func TestKillBetweenSteps(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillBetweenSteps(t, sharedStore, func(t *testing.T) consumetest.Resumable {
				return newNatsKillable(t, pa)
			})
		})
	}
}

// newNatsKillable is a stream of its own for pa's consumer.
func newNatsKillable(t *testing.T, pa path) *natsKillable {
	js, s, subj := stream(t)
	return &natsKillable{js: js, s: s, subj: subj, pa: pa}
}

// natsKillable is a consumetest.Killable and consumetest.Stoppable: a
// stream of its own, consumed by the durable consumer "kill".
type natsKillable struct {
	js   jetstream.JetStream
	s    jetstream.Stream
	subj string
	pa   path
}

func (k *natsKillable) Publish(t *testing.T, key string, _ []byte) { publish(t, k.js, k.subj, key, 0) }

func (k *natsKillable) Child(t *testing.T, env ...string) *childproc.Child {
	if _, err := k.s.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "kill", AckPolicy: jetstream.AckExplicitPolicy, AckWait: killAckWait}); err != nil {
		t.Fatal(err)
	}
	return childproc.Start(t, "TestKillChild", append(env, "IDEMNATS_KILL_PATH="+k.pa.name, "IDEMNATS_KILL_URL="+k.js.Conn().ConnectedUrl(),
		"IDEMNATS_KILL_STREAM="+k.s.CachedInfo().Config.Name)...)
}

// Drain fetches the redeliveries of all the path's messages (the child
// acked none) and handles them until each is acked.
func (k *natsKillable) Drain(t *testing.T, e *idem.Engine, _ consumetest.Stage, handle func(string)) {
	k.drain(t, e, k.pa.killConfig().Orders, func(_ context.Context, m jetstream.Msg) error {
		handle(m.Headers().Get("Order-Id"))
		return nil
	})
}

// Take fetches the redelivery of the stopped child's message and handles
// it until it is acked.
func (k *natsKillable) Take(t *testing.T, e *idem.Engine, handle func(context.Context, string) error) {
	k.drain(t, e, 1, func(ctx context.Context, m jetstream.Msg) error { return handle(ctx, m.Headers().Get("Order-Id")) })
}

// Zombied: the zombie left its delivery unacked, which only AckWait tells
// (it comes again, to be replayed).
func (k *natsKillable) Zombied(*testing.T) {}

// drain fetches from the durable consumer "kill" and processes on the path
// with fn until n messages are acked.
func (k *natsKillable) drain(t *testing.T, e *idem.Engine, n int, fn func(context.Context, jetstream.Msg) error) {
	ctx := context.Background()
	cons, err := k.s.Consumer(ctx, "kill")
	if err != nil {
		t.Fatal(err)
	}
	p := k.pa.wrap(t, e, &idemnats.Config{Operation: consumetest.KillOperation, Key: orderKey, AckWait: killAckWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) { return struct{}{}, fn(ctx, m) })
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
}
