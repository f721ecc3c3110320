package consumetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
)

// Resumable is a consumer adapter on its real broker as [KillBetweenSteps]
// runs it, on a queue (stream, topic) of the scenario's own.
type Resumable interface {
	// Publish publishes a message keyed key with payload to the queue.
	Publish(t *testing.T, key string, payload []byte)
	// Child starts the consumer process, as [Killable]'s Child does.
	Child(t *testing.T, env ...string) *childproc.Child
	// Take consumes the queue with another consumer of the adapter over e
	// (operation KillOperation), whose handler calls handle with its
	// context and the message's key, until that consumer has settled the
	// message the child held (stopped, or killed) as done (the broker
	// gives it to this consumer once the child's session, or its hold of
	// the message, ends), and fails t if that does not come. The consumer
	// may run on until t ends.
	Take(t *testing.T, e *idem.Engine, handle func(ctx context.Context, key string) error)
}

// orderSteps are the steps of [KillBetweenSteps]' handler, in the order
// it runs them.
var orderSteps = []string{"charge", "email", "ledger"}

// KillBetweenSteps is the steps scenario: a consumer process (the
// adapter's child test, [KillChild]) handles the scenario's one message
// with three steps ([idem.Step]: charge, email, ledger, each an effect
// downstream that must happen once) and is SIGKILLed once the second has
// returned, both recorded under its claim. The broker gives the message
// to another consumer (owner "survivor"), which takes the key over once
// the dead one's lease (KillLease) has run out and resumes: charge and
// email return the values the dead consumer recorded without running, and
// ledger runs. Each step's effect was made once (charge and email by the
// dead consumer, ledger by the survivor), the survivor ran the handler
// once and settled the message as done, and the record is COMPLETED, its
// steps dropped. newResumable makes the adapter on a queue of t's own;
// open the store both processes share.
func KillBetweenSteps(t *testing.T, open OpenStore, newResumable func(t *testing.T) Resumable) {
	ctx := context.Background()
	k := newResumable(t)
	key := orderKey(0)
	k.Publish(t, key, []byte(`{"order":0}`))
	prefix := fmt.Sprintf("consumetest-steps-%d:", rand.Uint64())
	st, _ := open(t, prefix)
	e, err := idem.New(st, &idem.Config{Lease: KillLease, Owner: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	effects := t.TempDir()
	ch := k.Child(t, envKillStage+"="+string(KilledBetweenSteps), envKillPrefix+"="+prefix, envKillBlock+"="+key, envEffects+"="+effects)
	stop := watch(ch)
	ch.WaitLine(t, "STEPPED "+orderSteps[1])
	stop()
	sk := storeKey(t, KillOperation, key)
	held, err := e.Status(ctx, sk)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = ch.Cmd.Wait()
	var names []string
	for _, s := range held.Steps {
		names = append(names, s.Name)
	}
	if held.Status != idem.StatusInProgress || !strings.HasPrefix(held.Owner, "child") || !slices.Equal(names, orderSteps[:2]) {
		t.Fatalf("%s when the child was killed: %s by %q with steps %v, want IN_PROGRESS by the child with steps %v",
			key, held.Status, held.Owner, names, orderSteps[:2])
	}
	if got, want := stepEffects(t, effects), map[string][]string{"charge": {"child"}, "email": {"child"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects when the child was killed: %v, want %v", got, want)
	}

	var (
		mu     sync.Mutex
		runs   int
		values []string
	)
	k.Take(t, e, func(ctx context.Context, got string) error {
		if got != key {
			return fmt.Errorf("consumetest: the survivor got %q, the scenario published only %q", got, key)
		}
		mu.Lock()
		runs++
		values = values[:0]
		mu.Unlock()
		return placeOrder(ctx, effects, "survivor", func(_, v string) {
			mu.Lock()
			values = append(values, v)
			mu.Unlock()
		})
	})

	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Errorf("the survivor ran %s's handler %d times, want 1", key, runs)
	}
	// charge and email answered from the record: the child's values.
	if want := []string{"child charge", "child email", "survivor ledger"}; !slices.Equal(values, want) {
		t.Errorf("the survivor's steps returned %q, want %q", values, want)
	}
	if got, want := stepEffects(t, effects), map[string][]string{"charge": {"child"}, "email": {"child"}, "ledger": {"survivor"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("effects made %v, want %v: each step's once", got, want)
	}
	done, err := e.Status(ctx, sk)
	if err != nil || done.Status != idem.StatusCompleted || !strings.HasPrefix(done.Owner, "survivor") || len(done.Steps) != 0 {
		t.Errorf("%s once the survivor settled it: %+v %v, want COMPLETED by the survivor, its steps dropped", key, done, err)
	}
}

// placeOrder is the handler of [KillBetweenSteps]: the steps orderSteps,
// each appending a line who to the file of dir named for it (its effect
// downstream) and returning "who name"; stepped is called with each
// step's name and the value it returned (recorded, or run now).
func placeOrder(ctx context.Context, dir, who string, stepped func(name, value string)) error {
	for _, name := range orderSteps {
		v, err := idem.Step(ctx, name, func(context.Context) (string, error) {
			return who + " " + name, appendLine(filepath.Join(dir, name), who)
		})
		if err != nil {
			return err
		}
		stepped(name, v)
	}
	return nil
}

func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stepEffects reads the effects of placeOrder in dir: who made each
// step's, in order, by step.
func stepEffects(t *testing.T, dir string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, name := range orderSteps {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[name] = strings.Fields(string(b))
	}
	return out
}
