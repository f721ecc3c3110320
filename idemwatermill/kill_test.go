package idemwatermill_test

import (
	"bufio"
	"context"
	"errors"
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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemwatermill"
)

// killLease is the lease of the kill and zombie tests' engines: a dead or
// stopped router's claim is taken over this long after its last renewal.
const killLease = time.Second

const killOrders = 4

// TestKillChild is the router process TestKillRouter and TestZombieRouter
// run: a router on IDEMWM_TOPIC of broker IDEMWM_BROKER (a member
// "child" of the topic's group), the engine over the real Redis under
// IDEMWM_PREFIX, its owner "child". It prints "RAN <key>" as each handler
// begins and "SETTLED <key> <verdict>" as each message is settled, and
// then:
//   - stage "handler": blocks in order-2's handler, to be killed there;
//   - stage "ack": blocks once order-3 is settled, before its ack, to be
//     killed there;
//   - stage "zombie": blocks in order-0's handler until a line comes on
//     its standard input (it is stopped and continued meanwhile), then
//     makes the order's effect (see effect) and returns.
func TestKillChild(t *testing.T) {
	stage := os.Getenv("IDEMWM_STAGE")
	if stage == "" {
		t.Skip("run by TestKillRouter and TestZombieRouter")
	}
	b := newBroker(t, os.Getenv("IDEMWM_BROKER"))
	prefix := os.Getenv("IDEMWM_PREFIX")
	var out sync.Mutex
	say := func(s string) { out.Lock(); fmt.Println(s); out.Unlock() }
	stdin := bufio.NewReader(os.Stdin)
	rc := redisClient(t)
	e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease, Owner: "child"})
	r := newRouter(t)
	_, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
		Operation: "ship", MetadataKey: "Idem-Key",
		Settled: func(m *message.Message, v consume.Verdict) {
			say(fmt.Sprintf("SETTLED %s %s", m.Metadata.Get("Idem-Key"), v.Action))
			if stage == "ack" && m.Metadata.Get("Idem-Key") == "order-3" {
				select {} // killed here, before the ack
			}
		},
	}, "ship", os.Getenv("IDEMWM_TOPIC"), b.member(t, os.Getenv("IDEMWM_TOPIC"), "child"), func(m *message.Message) error {
		key := m.Metadata.Get("Idem-Key")
		say("RAN " + key)
		switch {
		case stage == "handler" && key == "order-2":
			select {} // killed here
		case stage == "zombie" && key == "order-0":
			if _, err := stdin.ReadString('\n'); err != nil && err != io.EOF {
				return err
			}
			return effect(rc, prefix, m, "child")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	select {}
}

// effect is an order's effect downstream, made by who: a downstream that
// honours idempotency keys (SET NX under the claim's DownstreamKey), as
// the engine's docs ask of a downstream for exactly-once effects.
func effect(rc *redis.Client, prefix string, m *message.Message, who string) error {
	c, ok := idem.FromContext(m.Context())
	if !ok {
		return errors.New("no claim in the handler's context")
	}
	return rc.SetNX(context.Background(), prefix+"effect:"+c.DownstreamKey("ship"), who, time.Hour).Err()
}

// child starts TestKillChild for stage on broker and topic.
func child(t *testing.T, stage, broker, topic, prefix string) *childproc.Child {
	return childproc.Start(t, "TestKillChild", "IDEMWM_STAGE="+stage, "IDEMWM_BROKER="+broker, "IDEMWM_TOPIC="+topic, "IDEMWM_PREFIX="+prefix)
}

// state is key's record.
func state(t testing.TB, e *idem.Engine, key string) *idem.State {
	req := idem.Request{Operation: "ship", Key: key}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Status(context.Background(), id.StoreKey)
	if err != nil {
		return nil
	}
	return st
}

func recorded(t testing.TB, e *idem.Engine, key string) bool {
	st := state(t, e, key)
	return st != nil && st.Status == idem.StatusCompleted
}

// TestKillRouter, on each broker: two router processes consume one topic
// as members of one group. The first is SIGKILLed in order-2's handler
// (order-0 and order-1 done), or after order-3's outcome is recorded and
// before its ack. The second gets what the dead one left unacknowledged
// and runs again only what had not run to its end: order-2 (after the
// dead holder's lease) and order-3, or nothing.
func TestKillRouter(t *testing.T) {
	t.Parallel()
	for _, name := range brokerNames {
		for _, stage := range []string{"handler", "ack"} {
			t.Run(name+"/killed in "+stage, func(t *testing.T) {
				t.Parallel()
				b := newBroker(t, name)
				topic := b.topic(t)
				for i := range killOrders {
					b.publish(t, topic, msg("order-"+strconv.Itoa(i), []byte(`{"order":`+strconv.Itoa(i)+`}`)))
				}
				prefix := fmt.Sprintf("idemwm-kill-%d:", rand.Uint64())
				rc := redisClient(t)
				t.Cleanup(func() { cleanPrefix(rc, prefix) })
				e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease})
				c := child(t, stage, name, topic, prefix)
				if stage == "handler" {
					c.WaitLine(t, "RAN order-2")
					waitFor(t, 10*time.Second, "order-0 and order-1 recorded", func() bool {
						return recorded(t, e, "order-0") && recorded(t, e, "order-1")
					})
				} else {
					c.WaitLine(t, "SETTLED order-3 done")
				}
				_ = c.Cmd.Process.Kill() // SIGKILL
				_ = c.Cmd.Wait()

				var (
					mu   sync.Mutex
					runs = map[string]int{}
					done = map[string]bool{}
				)
				r := newRouter(t)
				_, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
					Operation: "ship", MetadataKey: "Idem-Key",
					Settled: func(m *message.Message, v consume.Verdict) {
						if v.Action == consume.Done {
							mu.Lock()
							done[m.Metadata.Get("Idem-Key")] = true
							mu.Unlock()
						}
					},
				}, "ship", topic, b.member(t, topic, "second"), func(m *message.Message) error {
					mu.Lock()
					runs[m.Metadata.Get("Idem-Key")]++
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				runRouter(t, r)
				// The dead router acked what it finished: the second sees
				// the rest.
				waitFor(t, 30*time.Second, "the orders left done", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return done["order-3"] && (stage == "ack" || done["order-2"])
				})
				wantRuns := map[string]int{}
				if stage == "handler" {
					wantRuns = map[string]int{"order-2": 1, "order-3": 1}
				}
				mu.Lock()
				defer mu.Unlock()
				if fmt.Sprint(runs) != fmt.Sprint(wantRuns) {
					t.Fatalf("the second router ran %v, want %v", runs, wantRuns)
				}
			})
		}
	}
}

// TestZombieRouter, on each broker: a router process stops (SIGSTOP) in
// order-0's handler, before the order's effect. The broker gives the
// message to another member of the group (heldFor), whose router takes
// the key over once the stopped one's lease has run out, makes the effect
// and records the outcome. The stopped router, continued, ends its
// handler: its effect is refused downstream (the same downstream key),
// its outcome write is refused (consume.Leave, nacked), and the record
// stays the taker's.
func TestZombieRouter(t *testing.T) {
	t.Parallel()
	for _, name := range brokerNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t, name)
			topic := b.topic(t)
			b.publish(t, topic, msg("order-0", []byte(`{"order":0}`)))
			prefix := fmt.Sprintf("idemwm-zombie-%d:", rand.Uint64())
			rc := redisClient(t)
			t.Cleanup(func() { cleanPrefix(rc, prefix) })
			e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease, Owner: "taker"})

			c := child(t, "zombie", name, topic, prefix)
			c.WaitLine(t, "RAN order-0")
			if err := c.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var (
				mu   sync.Mutex
				runs int
				done bool
			)
			r := newRouter(t)
			_, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
				Operation: "ship", MetadataKey: "Idem-Key",
				Settled: func(_ *message.Message, v consume.Verdict) {
					mu.Lock()
					done = done || v.Action == consume.Done
					mu.Unlock()
				},
			}, "ship", topic, b.member(t, topic, "taker"), func(m *message.Message) error {
				mu.Lock()
				runs++
				mu.Unlock()
				return effect(rc, prefix, m, "taker")
			})
			if err != nil {
				t.Fatal(err)
			}
			runRouter(t, r)
			waitFor(t, 30*time.Second, "the taker's outcome", func() bool { mu.Lock(); defer mu.Unlock(); return done })
			taken := state(t, e, "order-0")

			if err := c.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c.In, "go\n"); err != nil {
				t.Fatal(err)
			}
			c.WaitLine(t, "SETTLED order-0 leave")
			_ = c.Cmd.Process.Kill()
			_ = c.Cmd.Wait()

			mu.Lock()
			if runs != 1 {
				t.Errorf("the taker ran order-0 %d times, want 1", runs)
			}
			mu.Unlock()
			st := state(t, e, "order-0")
			if st == nil || st.Status != idem.StatusCompleted || !strings.HasPrefix(st.Owner, "taker") || st.Fence != taken.Fence || !st.CompletedAt.Equal(taken.CompletedAt) {
				t.Errorf("order-0's record after the zombie: %+v, want the taker's, as it was: %+v", st, taken)
			}
			keys, err := rc.Keys(context.Background(), prefix+"effect:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 1 {
				t.Fatalf("effects under %v, want one downstream key", keys)
			}
			if who, _ := rc.Get(context.Background(), keys[0]).Result(); who != "taker" {
				t.Errorf("the effect was made by %q, want the taker (the zombie's was refused downstream)", who)
			}
		})
	}
}

// cleanPrefix deletes the keys under prefix.
func cleanPrefix(rc *redis.Client, prefix string) {
	ctx := context.Background()
	keys, _ := rc.Keys(ctx, prefix+"*").Result()
	if len(keys) > 0 {
		rc.Del(ctx, keys...)
	}
}
