package consumetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
)

// Stoppable is a consumer adapter on its real broker as [ZombieHandler]
// runs it, on a queue (stream, topic) of the scenario's own.
type Stoppable interface {
	// Publish, Child, and Take: the consumer that takes the stopped
	// child's message over.
	Resumable
	// Zombied checks what the broker holds of the queue once the
	// continued child settled its copy (Leave) and was killed, where the
	// adapter can tell more than the store does (e.g. that nothing was
	// committed past the taker's commit); it may do nothing.
	Zombied(t *testing.T)
}

// ZombieHandler is the zombie scenario: a handler that outlives its
// lease. A consumer process (the adapter's child test, [KillChild]) is
// stopped (SIGSTOP) in the handler of the scenario's one message, before
// its effect. The broker gives the message to another consumer (the
// taker, owner "taker"), which takes the key over once the stopped one's
// lease (KillLease) has run out, makes the effect and records the
// outcome. The stopped consumer, continued, ends its handler: its effect
// is refused downstream (a downstream that honours the claim's
// DownstreamKey), its outcome write is refused (it settles the message by
// consume.Leave), and the record stays the taker's as it was; the taker
// ran the handler once. newStoppable makes the adapter on a queue of t's
// own; open the store both processes share.
func ZombieHandler(t *testing.T, open OpenStore, newStoppable func(t *testing.T) Stoppable) {
	ctx := context.Background()
	k := newStoppable(t)
	key := orderKey(0)
	k.Publish(t, key, []byte(`{"order":0}`))
	prefix := fmt.Sprintf("consumetest-zombie-%d:", rand.Uint64())
	st, _ := open(t, prefix)
	e, err := idem.New(st, &idem.Config{Lease: KillLease, Owner: "taker"})
	if err != nil {
		t.Fatal(err)
	}
	effects := t.TempDir()
	ch := k.Child(t, envKillStage+"="+string(StoppedInHandler), envKillPrefix+"="+prefix, envKillBlock+"="+key, envEffects+"="+effects)
	stop := watch(ch)
	ch.WaitLine(t, "RAN "+key)
	stop()
	if err := ch.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	k.Take(t, e, func(ctx context.Context, got string) error {
		if got != key {
			return fmt.Errorf("consumetest: the taker got %q, the scenario published only %q", got, key)
		}
		runs.Add(1)
		return effect(ctx, effects, "taker")
	})
	sk := storeKey(t, KillOperation, key)
	taken, err := e.Status(ctx, sk)
	if err != nil || taken.Status != idem.StatusCompleted || !strings.HasPrefix(taken.Owner, "taker") {
		t.Fatalf("%s once the taker settled it: %+v %v, want COMPLETED by the taker", key, taken, err)
	}

	if err := ch.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(ch.In, "go\n"); err != nil {
		t.Fatal(err)
	}
	stop = watch(ch)
	ch.WaitLine(t, "SETTLED "+key+" "+consume.Leave.String())
	stop()
	_ = ch.Cmd.Process.Kill()
	_ = ch.Cmd.Wait()
	k.Zombied(t)

	if n := runs.Load(); n != 1 {
		t.Errorf("the taker ran %s %d times, want 1", key, n)
	}
	after, err := e.Status(ctx, sk)
	if err != nil || after.Status != idem.StatusCompleted || after.Owner != taken.Owner || after.Fence != taken.Fence || !after.CompletedAt.Equal(taken.CompletedAt) {
		t.Errorf("%s's record after the zombie: %+v %v, want the taker's, as it was: %+v", key, after, err, taken)
	}
	made, err := os.ReadDir(effects)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 1 {
		t.Fatalf("%d effects downstream, want one under the claim's downstream key", len(made))
	}
	if who, err := os.ReadFile(filepath.Join(effects, made[0].Name())); err != nil || string(who) != "taker" {
		t.Errorf("the effect was made by %q (%v), want the taker (the zombie's was refused downstream)", who, err)
	}
}

// effect is a message's effect downstream, made by who: a file in dir
// named by the claim's DownstreamKey, created only where none is — a
// downstream that honours idempotency keys, as the engine's docs ask of
// one for exactly-once effects. A second effect under the same key is
// refused (the file stays its maker's) and answered as a success, as
// such a downstream answers a repeated request.
func effect(ctx context.Context, dir, who string) error {
	c, ok := idem.FromContext(ctx)
	if !ok {
		return errors.New("consumetest: the handler runs without a claim")
	}
	f, err := os.OpenFile(filepath.Join(dir, c.DownstreamKey(KillOperation)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(who); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
