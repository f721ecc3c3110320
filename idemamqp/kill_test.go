package idemamqp_test

import (
	"context"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// blockingAck stands for a process that dies after the engine recorded
// COMPLETED and before its Ack reached the broker.
type blockingAck struct {
	amqp.Acknowledger
	c  *consumetest.ChildConsumer
	id string
}

func (b blockingAck) Ack(uint64, bool) error {
	b.c.Acking(b.id)
	return nil
}

// killConfig is how one run of the path takes its deliveries: one alone,
// or four in a batch, whose handlers run at once.
func (p path) killConfig() consumetest.KillConfig {
	if p.batch {
		return consumetest.KillConfig{Orders: 4}
	}
	return consumetest.KillConfig{Orders: 1}
}

// TestChildConsumer is the consumer process consumetest.KillMidHandler,
// consumetest.ZombieHandler and consumetest.KillBetweenSteps run: it
// collects the path's (IDEMAMQP_CHILD_PATH) deliveries (one, for
// ZombieHandler and KillBetweenSteps) from
// IDEMAMQP_CHILD_QUEUE, handles them on the path, never acks them, and
// says how it settled them. Its connection heartbeats every childHeartbeat,
// so that RabbitMQ closes it, and requeues its delivery, soon after the
// process is stopped.
func TestChildConsumer(t *testing.T) {
	cc := consumetest.KillChild(t, sharedStore)
	if cc == nil {
		t.Skip("the child consumer of TestSIGKILL, TestZombieHandler and TestKillBetweenSteps")
	}
	pa := pathNamed(t, os.Getenv("IDEMAMQP_CHILD_PATH"))
	conn, err := amqp.DialConfig("amqp://guest:guest@"+testenv.Reach(t, "RabbitMQ", "IDEM_AMQP_ADDR", "127.0.0.1:5672")+"/",
		amqp.Config{Heartbeat: childHeartbeat, Locale: "en_US"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := channel(t, conn)
	c, err := idemamqp.New(cc.Engine, &idemamqp.Config{Operation: consumetest.KillOperation},
		func(ctx context.Context, d amqp.Delivery) error { return cc.Handle(ctx, d.MessageId) })
	if err != nil {
		t.Fatal(err)
	}
	n := pa.killConfig().Orders
	if cc.Single() {
		n = 1
	}
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(os.Getenv("IDEMAMQP_CHILD_QUEUE"), "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var batch []amqp.Delivery
	for d := range ds {
		d.Acknowledger = blockingAck{d.Acknowledger, cc, d.MessageId}
		if batch = append(batch, d); len(batch) == n {
			break
		}
	}
	for i, st := range pa.handle(context.Background(), c, batch) {
		cc.Settled(batch[i].MessageId, st.Verdict)
	}
	select {}
}

// childHeartbeat is the heartbeat interval of the child's connection
// (amqp091 negotiates it in whole seconds).
const childHeartbeat = time.Second

// TestSIGKILL: consumetest's kill scenario on each path (Handle, or
// HandleBatch with four deliveries): a consumer killed (SIGKILL) in its
// handler (in a batch, with the others' outcomes recorded): the message is
// redelivered and handled once more after the lease. A consumer killed
// after every outcome was recorded and while an Ack is under way: the
// messages are redelivered and replayed, never handled twice. The
// redeliveries are handled by Run, or RunBatch on the batch path.
func TestSIGKILL(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillMidHandler(t, sharedStore, pa.killConfig(), func(t *testing.T) consumetest.Killable {
				return newAMQPKillable(t, pa)
			})
		})
	}
}

// newAMQPKillable is a connection of its own to a work queue of its own.
func newAMQPKillable(t *testing.T, pa path) *amqpKillable {
	conn := dial(t)
	work, _ := queues(t, conn)
	return &amqpKillable{conn: conn, work: work, pub: channel(t, conn), pa: pa}
}

// TestZombieHandler: consumetest's zombie scenario on each path. A
// consumer process stops (SIGSTOP) in order-0's handler; RabbitMQ closes
// its connection when it misses its heartbeats and requeues the delivery
// to another consumer (Run, or RunBatch on the batch path), which takes
// the key over once the stopped one's lease has run out, runs it and
// acks. The stopped consumer, continued, ends its handler: its effect is
// refused downstream and its outcome write is refused (consume.Leave).
func TestZombieHandler(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.ZombieHandler(t, sharedStore, func(t *testing.T) consumetest.Stoppable {
				return newAMQPKillable(t, pa)
			})
		})
	}
}

// TestKillBetweenSteps: consumetest's steps scenario on each path (on the
// batch path, a batch of one, run by DoBatch). A consumer process is
// SIGKILLed between the second and third steps of its handler; RabbitMQ
// requeues its delivery when its connection drops, to another consumer
// (Run, or RunBatch on the batch path), which delays it while the dead
// one's lease lasts, then takes the key over, resumes after the two
// recorded steps (running only the third) and acks.
func TestKillBetweenSteps(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillBetweenSteps(t, sharedStore, func(t *testing.T) consumetest.Resumable {
				return newAMQPKillable(t, pa)
			})
		})
	}
}

// amqpKillable is a consumetest.Killable and consumetest.Stoppable: a
// work queue of its own.
type amqpKillable struct {
	conn *amqp.Connection
	work string
	pub  *amqp.Channel
	pa   path
}

func (k *amqpKillable) Publish(t *testing.T, key string, payload []byte) {
	publish(t, k.pub, k.work, key, payload)
}

func (k *amqpKillable) Child(t *testing.T, env ...string) *childproc.Child {
	return childproc.Start(t, "TestChildConsumer", append(env, "IDEMAMQP_CHILD_QUEUE="+k.work, "IDEMAMQP_CHILD_PATH="+k.pa.name)...)
}

// Drain consumes the redeliveries of all the path's deliveries (the child
// acked none) until each is acknowledged.
func (k *amqpKillable) Drain(t *testing.T, e *idem.Engine, _ consumetest.Stage, handle func(string)) {
	k.drain(t, e, k.pa.killConfig().Orders, func(_ context.Context, d amqp.Delivery) error { handle(d.MessageId); return nil })
}

// Take consumes the stopped child's delivery, once requeued, until it is
// acknowledged.
func (k *amqpKillable) Take(t *testing.T, e *idem.Engine, handle func(context.Context, string) error) {
	k.drain(t, e, 1, func(ctx context.Context, d amqp.Delivery) error { return handle(ctx, d.MessageId) })
}

// Zombied: the zombie's connection was closed, its delivery requeued
// already; the broker tells no more.
func (k *amqpKillable) Zombied(*testing.T) {}

// drain consumes the work queue on the path with fn until n deliveries are
// acknowledged.
func (k *amqpKillable) drain(t *testing.T, e *idem.Engine, n int, fn func(context.Context, amqp.Delivery) error) {
	cnt := newCounter()
	c, err := idemamqp.New(e, &idemamqp.Config{Operation: consumetest.KillOperation, Backoff: 100 * time.Millisecond, Settled: cnt.settled}, fn)
	if err != nil {
		t.Fatal(err)
	}
	if k.pa.batch {
		runBatch(t, k.conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: k.work}, Size: n})
	} else {
		run(t, k.conn, c, k.work, 1)
	}
	eventually(t, 10*time.Second, "every redelivery acknowledged", func() bool { return cnt.action(idemamqp.Acked) == n })
	cnt.mu.Lock()
	t.Logf("settlements after the kill %v", cnt.actions)
	cnt.mu.Unlock()
}
