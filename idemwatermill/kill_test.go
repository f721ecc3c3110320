package idemwatermill_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store"
)

// wmKill is how the kill scenario's router takes its messages: four on
// one topic, handled one after another; killed in order-2's handler
// (order-0 and order-1 done).
var wmKill = consumetest.KillConfig{Orders: 4, BlockAt: 2, Sequential: true}

// killStore is sharedStore, its keys deleted at cleanup.
func killStore(t testing.TB, prefix string) (store.Store, string) {
	rc := redisClient(t)
	t.Cleanup(func() { cleanPrefix(rc, prefix) })
	return sharedStore(t, prefix)
}

// TestKillChild is the router process consumetest.KillMidHandler and
// consumetest.ZombieHandler run: a router on IDEMWM_TOPIC of broker
// IDEMWM_BROKER (a member "child" of the topic's group). Killed in an ack,
// it blocks once the last order is settled, before its ack.
func TestKillChild(t *testing.T) {
	cc := consumetest.KillChild(t, killStore)
	if cc == nil {
		t.Skip("run by TestKillMidHandler and TestZombieHandler")
	}
	b := newBroker(t, os.Getenv("IDEMWM_BROKER"))
	topic := os.Getenv("IDEMWM_TOPIC")
	last := fmt.Sprintf("order-%d", wmKill.Orders-1)
	r := newRouter(t)
	_, err := idemwatermill.AddConsumerHandler(r, cc.Engine, &idemwatermill.Config{
		Operation: consumetest.KillOperation, MetadataKey: "Idem-Key",
		Settled: func(m *message.Message, v consume.Verdict) {
			key := m.Metadata.Get("Idem-Key")
			cc.Settled(key, v)
			if cc.Stage == consumetest.KilledInAck && key == last {
				cc.Acking(key) // killed here, before the ack
			}
		},
	}, "ship", topic, b.member(t, topic, "child"), func(m *message.Message) error {
		return cc.Handle(m.Context(), m.Metadata.Get("Idem-Key"))
	})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	select {}
}

// TestKillMidHandler: consumetest's kill scenario on each broker. Two
// router processes consume one topic as members of one group. The first
// is SIGKILLed in order-2's handler (order-0 and order-1 done), or after
// order-3's outcome is recorded and before its ack. The second gets what
// the dead one left unacknowledged and runs again only what had not run
// to its end: order-2 (after the dead holder's lease) and order-3, or
// nothing.
func TestKillMidHandler(t *testing.T) {
	t.Parallel()
	for _, name := range brokerNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillMidHandler(t, killStore, wmKill, func(t *testing.T) consumetest.Killable { return newGroupTopic(t, name) })
		})
	}
}

// TestKillBetweenSteps: consumetest's steps scenario on each broker. A
// router process is SIGKILLed once its handler's second step of three has
// returned; the message goes to another member of the group, whose router
// resumes after the two finished steps: each step's effect happened once.
func TestKillBetweenSteps(t *testing.T) {
	t.Parallel()
	for _, name := range brokerNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			consumetest.KillBetweenSteps(t, killStore, func(t *testing.T) consumetest.Resumable { return newGroupTopic(t, name) })
		})
	}
}

// TestZombieHandler: consumetest's zombie scenario on each broker. A
// router process stops (SIGSTOP) in order-0's handler, before the order's
// effect. The broker gives the message to another member of the group
// (heldFor), whose router takes the key over once the stopped one's lease
// has run out, makes the effect and records the outcome. The stopped
// router, continued, ends its handler: its effect is refused downstream
// (the same downstream key), its outcome write is refused (consume.Leave,
// nacked), and the record stays the taker's.
func TestZombieHandler(t *testing.T) {
	t.Parallel()
	for _, name := range brokerNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			consumetest.ZombieHandler(t, killStore, func(t *testing.T) consumetest.Stoppable { return newGroupTopic(t, name) })
		})
	}
}

// groupTopic is a consumetest.Killable and consumetest.Stoppable: a topic
// of its own on the broker named name, consumed by the members of its
// group.
type groupTopic struct {
	b     broker
	name  string
	topic string
	keys  []string // published, in order
}

func newGroupTopic(t *testing.T, name string) *groupTopic {
	b := newBroker(t, name)
	return &groupTopic{b: b, name: name, topic: b.topic(t)}
}

func (g *groupTopic) Publish(t *testing.T, key string, payload []byte) {
	g.b.publish(t, g.topic, msg(key, payload))
	g.keys = append(g.keys, key)
}

func (g *groupTopic) Child(t *testing.T, env ...string) *childproc.Child {
	return childproc.Start(t, "TestKillChild", append(env, "IDEMWM_BROKER="+g.name, "IDEMWM_TOPIC="+g.topic)...)
}

// consume runs a router over e, as the group's member consumer, until t
// ends, and waits for the messages keyed want settled as done.
func (g *groupTopic) consume(t *testing.T, e *idem.Engine, consumer string, want []string, handle func(*message.Message) error) {
	var (
		mu   sync.Mutex
		done = map[string]bool{}
	)
	r := newRouter(t)
	_, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
		Operation: consumetest.KillOperation, MetadataKey: "Idem-Key",
		Settled: func(m *message.Message, v consume.Verdict) {
			if v.Action == consume.Done {
				mu.Lock()
				done[m.Metadata.Get("Idem-Key")] = true
				mu.Unlock()
			}
		},
	}, "ship", g.topic, g.b.member(t, g.topic, consumer), handle)
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	waitFor(t, 30*time.Second, fmt.Sprintf("%v done", want), func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range want {
			if !done[k] {
				return false
			}
		}
		return true
	})
}

// Drain consumes what the dead router left unacknowledged (it acked what
// it finished) until it is done: from the message it was killed in, or
// the last one, whose ack it was killed in.
func (g *groupTopic) Drain(t *testing.T, e *idem.Engine, stage consumetest.Stage, handle func(string)) {
	left := g.keys[wmKill.BlockAt:]
	if stage == consumetest.KilledInAck {
		left = g.keys[len(g.keys)-1:]
	}
	g.consume(t, e, "second", left, func(m *message.Message) error { handle(m.Metadata.Get("Idem-Key")); return nil })
}

// Take consumes the message the stopped router holds, once the broker
// gives it to another member, until it is done.
func (g *groupTopic) Take(t *testing.T, e *idem.Engine, handle func(context.Context, string) error) {
	g.consume(t, e, "taker", g.keys, func(m *message.Message) error { return handle(m.Context(), m.Metadata.Get("Idem-Key")) })
}

// Zombied: the brokers do not tell more than the store (the zombie's nack
// sends the message round again, to be replayed).
func (g *groupTopic) Zombied(*testing.T) {}

// cleanPrefix deletes the keys under prefix.
func cleanPrefix(rc *redis.Client, prefix string) {
	ctx := context.Background()
	keys, _ := rc.Keys(ctx, prefix+"*").Result()
	if len(keys) > 0 {
		rc.Del(ctx, keys...)
	}
}
