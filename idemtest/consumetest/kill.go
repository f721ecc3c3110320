package consumetest

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
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
)

// Stage is where [KillMidHandler] kills the child consumer, or where
// [ZombieHandler] stops it.
type Stage string

const (
	// KilledInHandler: in the handler of the message at
	// KillConfig.BlockAt, the handlers before it (all the others, when
	// they run at once) recorded.
	KilledInHandler Stage = "handler"
	// KilledInAck: after every outcome was recorded, with an
	// acknowledgement (or offset commit) under way and never done.
	KilledInAck Stage = "ack"
	// StoppedInHandler: in the handler of the scenario's one message,
	// stopped (SIGSTOP) and continued; the handler then makes its effect
	// downstream and returns ([ZombieHandler]).
	StoppedInHandler Stage = "stopped"
	// KilledBetweenSteps: in the handler of the scenario's one message,
	// once the second of its three steps returned, both recorded
	// ([KillBetweenSteps]).
	KilledBetweenSteps Stage = "steps"
)

// KillOperation is the operation name of the kill scenario's consumers;
// KillLease the lease of their engines: a dead consumer's claim is taken
// over this long after its last renewal.
const (
	KillOperation = "ship"
	KillLease     = time.Second
)

// The environment of a child consumer.
const (
	envKillStage  = "CONSUMETEST_KILL_STAGE"
	envKillPrefix = "CONSUMETEST_KILL_PREFIX"
	envKillBlock  = "CONSUMETEST_KILL_BLOCK"
	envEffects    = "CONSUMETEST_EFFECTS"
)

// KillConfig says how an adapter's child consumer takes its messages.
type KillConfig struct {
	// Orders is how many messages the child takes (the scenario keys them
	// order-0, order-1, …).
	Orders int
	// BlockAt is the message whose handler the child is killed in.
	BlockAt int
	// Sequential: the child runs its handlers one after another, so that
	// those after BlockAt never begin; otherwise they all run at once (a
	// batch) and every other one is recorded before the kill.
	Sequential bool
}

// Killable is a consumer adapter on its real broker as [KillMidHandler]
// runs it, on a queue (stream, topic) of the scenario's own.
type Killable interface {
	// Publish publishes a message keyed key with payload to the queue.
	Publish(t *testing.T, key string, payload []byte)
	// Child starts the consumer process: the adapter's test that calls
	// [KillChild] (childproc.Start), with env added to what the adapter
	// passes itself (where its queue is).
	Child(t *testing.T, env ...string) *childproc.Child
	// Drain consumes the queue with a consumer of the adapter over e
	// (operation KillOperation), whose handler calls handle with each
	// message's key, until every message the killed child left
	// unacknowledged (uncommitted) is acknowledged (committed), and fails t
	// if that does not come.
	Drain(t *testing.T, e *idem.Engine, stage Stage, handle func(key string))
}

// KillMidHandler is the kill scenario, in each [Stage]: a consumer process
// is SIGKILLed mid-handler, or after its outcomes were recorded and before
// its acknowledgement (commit) reached the broker; a consumer that gets
// what the dead one left (after the dead holder's lease) runs again only
// the handler that was cut off and those that had not begun, and
// acknowledges every message. newKillable makes the adapter on a queue of
// the subtest's own; open the store both processes share.
//
// DoBatch's answers (a batch's acks) are made one after another, so an
// ack that never returns holds up the later ones of its batch: in
// KilledInAck the scenario waits for every outcome recorded in the store,
// not for every ack begun.
func KillMidHandler(t *testing.T, open OpenStore, c KillConfig, newKillable func(t *testing.T) Killable) {
	for _, stage := range []Stage{KilledInHandler, KilledInAck} {
		t.Run("killed in "+string(stage), func(t *testing.T) {
			t.Parallel()
			killMidHandler(t, open, c, newKillable(t), stage)
		})
	}
}

func orderKey(i int) string { return "order-" + strconv.Itoa(i) }

// childBounds is the longest a scenario waits for a line of its child.
const childBounds = time.Minute

// watch kills ch should it not be stopped within childBounds, so that a
// line of the child that never comes fails the scenario (the child's
// output ends) instead of hanging it.
func watch(ch *childproc.Child) (stop func()) {
	tm := time.AfterFunc(childBounds, func() { _ = ch.Cmd.Process.Kill() })
	return func() { tm.Stop() }
}

func killMidHandler(t *testing.T, open OpenStore, c KillConfig, k Killable, stage Stage) {
	ctx := context.Background()
	for i := range c.Orders {
		k.Publish(t, orderKey(i), []byte(`{"order":`+strconv.Itoa(i)+`}`))
	}
	prefix := fmt.Sprintf("consumetest-kill-%d:", rand.Uint64())
	st, _ := open(t, prefix)
	e, err := idem.New(st, &idem.Config{Lease: KillLease, Owner: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	// What runs in the child: up to the blocked handler, or every handler.
	ran := c.Orders
	if stage == KilledInHandler && c.Sequential {
		ran = c.BlockAt + 1
	}
	ch := k.Child(t, envKillStage+"="+string(stage), envKillPrefix+"="+prefix, envKillBlock+"="+orderKey(c.BlockAt))
	began, acking := map[string]bool{}, 0
	stop := watch(ch)
	ch.Scan(t, func(line string) bool {
		if key, ok := strings.CutPrefix(line, "RAN "); ok {
			began[key] = true
		}
		if strings.HasPrefix(line, "ACKING ") {
			acking++
		}
		return len(began) == ran && (stage == KilledInHandler || acking > 0)
	})
	stop()
	// Kill once the finished handlers' outcomes are recorded (every one's,
	// when killed in an ack).
	for i := range ran {
		if stage == KilledInHandler && i == c.BlockAt {
			continue
		}
		id, err := (&idem.Request{Operation: KillOperation, Key: orderKey(i)}).Identity()
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, orderKey(i)+" recorded by the child", func() bool {
			s, err := e.Status(ctx, id.StoreKey)
			return err == nil && s.Status == idem.StatusCompleted
		})
	}
	if err := ch.Cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = ch.Cmd.Wait()
	if len(began) != ran {
		t.Fatalf("the child ran %d handlers, want %d", len(began), ran)
	}

	var mu sync.Mutex
	runs := map[string]int{}
	k.Drain(t, e, stage, func(key string) {
		mu.Lock()
		runs[key]++
		mu.Unlock()
	})
	want := map[string]int{}
	if stage == KilledInHandler {
		want[orderKey(c.BlockAt)] = 1
		for i := ran; i < c.Orders; i++ {
			want[orderKey(i)] = 1
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Fatalf("handlers ran %v after the kill, want %v", runs, want)
	}
}

// ChildConsumer is the consumer process of [KillMidHandler] and
// [ZombieHandler], as the adapter's child test runs it.
type ChildConsumer struct {
	// Stage is where the process is to be killed (stopped).
	Stage Stage
	// Engine is its engine, over the store the scenario shares (Lease
	// KillLease, owner "child"); the consumer runs operation
	// KillOperation with it.
	Engine *idem.Engine

	block   string
	effects string
	stdin   *bufio.Reader
	out     sync.Mutex
}

// KillChild is the child's side of [KillMidHandler] and [ZombieHandler]:
// the adapter's child test calls it first, and skips when it returns nil
// (run as an ordinary test); otherwise it consumes its queue with
// c.Engine, calling c.Handle as its handler, c.Settled (where the adapter
// reports settlements) as each message is settled, and c.Acking where an
// acknowledgement (commit) the scenario kills it in begins; it is killed
// before it returns.
func KillChild(t *testing.T, open OpenStore) *ChildConsumer {
	stage := os.Getenv(envKillStage)
	if stage == "" {
		return nil
	}
	st, _ := open(t, os.Getenv(envKillPrefix))
	e, err := idem.New(st, &idem.Config{Lease: KillLease, Owner: "child"})
	if err != nil {
		t.Fatal(err)
	}
	return &ChildConsumer{Stage: Stage(stage), Engine: e, block: os.Getenv(envKillBlock),
		effects: os.Getenv(envEffects), stdin: bufio.NewReader(os.Stdin)}
}

func (c *ChildConsumer) say(s string) {
	c.out.Lock()
	defer c.out.Unlock()
	fmt.Println(s)
}

// Single reports whether the scenario publishes one message, which the
// child takes alone ([ZombieHandler], [KillBetweenSteps]).
func (c *ChildConsumer) Single() bool {
	return c.Stage == StoppedInHandler || c.Stage == KilledBetweenSteps
}

// Handle is the child's handler of the message keyed key, ctx the
// handler's context (carrying its claim): it says so and, in
// KilledInHandler, never returns from the handler of the blocked message;
// in StoppedInHandler, the handler of the blocked message waits for a
// line on the standard input (the process is stopped and continued
// meanwhile), then makes the message's effect downstream and returns; in
// KilledBetweenSteps, the handler of the blocked message runs the
// scenario's steps, says each one that returned, and never returns after
// the second.
func (c *ChildConsumer) Handle(ctx context.Context, key string) error {
	c.say("RAN " + key)
	if key != c.block {
		return nil
	}
	switch c.Stage {
	case KilledInHandler:
		select {} // killed here
	case StoppedInHandler:
		if _, err := c.stdin.ReadString('\n'); err != nil && err != io.EOF {
			return err
		}
		return effect(ctx, c.effects, "child")
	case KilledBetweenSteps:
		return placeOrder(ctx, c.effects, "child", func(name, _ string) {
			c.say("STEPPED " + name)
			if name == orderSteps[1] {
				select {} // killed here
			}
		})
	}
	return nil
}

// Settled says that the message keyed key was settled by v.
func (c *ChildConsumer) Settled(key string, v consume.Verdict) {
	c.say("SETTLED " + key + " " + v.Action.String())
}

// Acking says that an acknowledgement (commit) of key begins, and never
// returns: the child is killed there.
func (c *ChildConsumer) Acking(key string) {
	c.say("ACKING " + key)
	select {}
}
