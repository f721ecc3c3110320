package idemkafka_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// kafkaKill is how the kill scenario's consumer takes its records: four
// on one partition, in one batch whose handlers run one after another;
// killed in order-2's (order-0 and order-1 recorded, order-3 not begun).
var kafkaKill = consumetest.KillConfig{Orders: 4, BlockAt: 2, Sequential: true}

func orderKey(r *kgo.Record) (string, error) { return string(r.Key), nil }

// TestKillChild is the consumer process consumetest.KillMidHandler and
// consumetest.ZombieHandler run: a Consumer of IDEMKAFKA_GROUP on
// IDEMKAFKA_TOPIC at IDEMKAFKA_BROKERS. Killed in a commit, it blocks once
// the partition's last record is settled, before the batch's offsets are
// committed.
func TestKillChild(t *testing.T) {
	cc := consumetest.KillChild(t, sharedStore)
	if cc == nil {
		t.Skip("run by TestKillMidHandler and TestZombieHandler")
	}
	seeds := strings.Split(os.Getenv("IDEMKAFKA_BROKERS"), ",")
	last := int64(kafkaKill.Orders - 1)
	c, err := idemkafka.New(cc.Engine, &idemkafka.Config{
		Operation: consumetest.KillOperation, Key: orderKey,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			cc.Settled(string(r.Key), v)
			if cc.Stage == consumetest.KilledInAck && r.Offset == last {
				cc.Acking(string(r.Key)) // killed here, before the commit
			}
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		return struct{}{}, cc.Handle(ctx, string(r.Key))
	}, groupOpts(seeds, os.Getenv("IDEMKAFKA_GROUP"), os.Getenv("IDEMKAFKA_TOPIC"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestKillMidHandler: consumetest's kill scenario. A consumer process is
// SIGKILLed mid-batch — with order-2's handler running, order-0 and
// order-1 recorded and order-3 not begun, or with every outcome recorded
// and the batch's offsets not yet committed — and has committed nothing.
// A consumer that takes the partition over after the dead one's session
// ended runs again only what had not run to its end (order-2, after the
// dead holder's lease, and order-3), and commits to the end.
func TestKillMidHandler(t *testing.T) {
	t.Parallel()
	consumetest.KillMidHandler(t, sharedStore, kafkaKill, func(t *testing.T) consumetest.Killable { return newPartition(t) })
}

// TestZombieHandler: consumetest's zombie scenario. A consumer process
// stops (SIGSTOP) in order-0's handler; the group's session ends, its
// partition goes to another consumer, which takes order-0's key over once
// the stopped one's lease has run out, runs it and commits. The stopped
// consumer, continued, ends its handler: its outcome write is refused
// (consume.Leave), and it commits nothing past what the new owner did.
func TestZombieHandler(t *testing.T) {
	t.Parallel()
	consumetest.ZombieHandler(t, sharedStore, func(t *testing.T) consumetest.Stoppable { return newPartition(t) })
}

// TestKillBetweenSteps: consumetest's steps scenario. A consumer process
// is SIGKILLed once its handler's second step of three has returned; the
// group's next consumer gets the record again and resumes after the two
// finished steps: each step's effect happened once.
func TestKillBetweenSteps(t *testing.T) {
	t.Parallel()
	consumetest.KillBetweenSteps(t, sharedStore, func(t *testing.T) consumetest.Resumable { return newPartition(t) })
}

// partition is a consumetest.Killable and consumetest.Stoppable: a topic
// of its own with one partition, consumed by the group "g-<topic>".
type partition struct {
	seeds     []string
	tp, group string
	n         int64 // records published
}

func newPartition(t *testing.T) *partition {
	seeds := brokers(t)
	tp := topic(t, seeds, 1)
	return &partition{seeds: seeds, tp: tp, group: "g-" + tp}
}

func (p *partition) Publish(t *testing.T, key string, payload []byte) {
	produce(t, p.seeds, &kgo.Record{Topic: p.tp, Partition: 0, Key: []byte(key), Value: payload})
	p.n++
}

func (p *partition) Child(t *testing.T, env ...string) *childproc.Child {
	return childproc.Start(t, "TestKillChild", append(env, "IDEMKAFKA_BROKERS="+strings.Join(p.seeds, ","),
		"IDEMKAFKA_TOPIC="+p.tp, "IDEMKAFKA_GROUP="+p.group)...)
}

// consume runs a consumer of the group over e until t ends, and waits for
// the partition committed to its end.
func (p *partition) consume(t *testing.T, e *idem.Engine, handle func(context.Context, *kgo.Record) error) {
	c, err := idemkafka.New(e, &idemkafka.Config{Operation: consumetest.KillOperation, Key: orderKey},
		func(ctx context.Context, r *kgo.Record) (struct{}, error) { return struct{}{}, handle(ctx, r) },
		groupOpts(p.seeds, p.group, p.tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, 30*time.Second, "the partition committed to its end", func() bool { return committed(t, p.seeds, p.group, p.tp, 0) == p.n })
}

// Drain checks that the killed consumer committed nothing, then consumes
// the partition until it is committed to its end.
func (p *partition) Drain(t *testing.T, e *idem.Engine, _ consumetest.Stage, handle func(string)) {
	if got := committed(t, p.seeds, p.group, p.tp, 0); got != -1 {
		t.Fatalf("the killed consumer committed %d", got)
	}
	p.consume(t, e, func(_ context.Context, r *kgo.Record) error { handle(string(r.Key)); return nil })
}

// Take consumes the partition, once the stopped consumer's session ended,
// until it is committed past the record.
func (p *partition) Take(t *testing.T, e *idem.Engine, handle func(context.Context, string) error) {
	p.consume(t, e, func(ctx context.Context, r *kgo.Record) error { return handle(ctx, string(r.Key)) })
}

// Zombied checks that the zombie's batch committed nothing past the
// taker's commit.
func (p *partition) Zombied(t *testing.T) {
	if got := committed(t, p.seeds, p.group, p.tp, 0); got != p.n {
		t.Errorf("committed %d after the zombie's batch, want %d", got, p.n)
	}
}
