package idemwatermill_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemwatermill"
)

// killLease is the lease of the kill test's engines: a dead router's
// claim is taken over this long after its last renewal.
const killLease = time.Second

const killOrders = 4

// TestKillChild is the router process TestKillRouter runs and kills: a
// router on IDEMWM_TOPIC (consumer "child" of group "g"), the engine over
// the real Redis under IDEMWM_PREFIX. It prints "RAN <key>" as each
// handler begins and "SETTLED <key> <verdict>", and blocks in order-2's
// handler (stage "handler") or, once order-3 is settled, before its ack
// (stage "ack").
func TestKillChild(t *testing.T) {
	stage := os.Getenv("IDEMWM_STAGE")
	if stage == "" {
		t.Skip("run by TestKillRouter")
	}
	s := newStreams(t)
	var out sync.Mutex
	say := func(s string) { out.Lock(); fmt.Println(s); out.Unlock() }
	e := newEngine(t, redisStore(t, os.Getenv("IDEMWM_PREFIX")), idem.Config{Lease: killLease})
	r := newRouter(t)
	_, err := idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
		Operation: "ship", MetadataKey: "Idem-Key",
		Settled: func(m *message.Message, v consume.Verdict) {
			say(fmt.Sprintf("SETTLED %s %s", m.Metadata.Get("Idem-Key"), v.Action))
			if stage == "ack" && m.Metadata.Get("Idem-Key") == "order-3" {
				select {} // killed here, before the ack
			}
		},
	}, "ship", os.Getenv("IDEMWM_TOPIC"), s.subscriber("g", "child", time.Hour), func(m *message.Message) error {
		say("RAN " + m.Metadata.Get("Idem-Key"))
		if stage == "handler" && m.Metadata.Get("Idem-Key") == "order-2" {
			select {} // killed here
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, r)
	select {}
}

// TestKillRouter: two router processes consume one topic in one consumer
// group. The first is SIGKILLed in order-2's handler (order-0 and order-1
// done and acked), or after order-3's outcome is recorded and before its
// ack. The second claims what the dead one left pending and runs again
// only what had not run to its end: order-2 (after the dead holder's
// lease) and order-3, or nothing.
func TestKillRouter(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"handler", "ack"} {
		t.Run("killed in "+stage, func(t *testing.T) {
			t.Parallel()
			s := newStreams(t)
			topic := s.topic()
			for i := range killOrders {
				s.publish(topic, msg("order-"+strconv.Itoa(i), []byte(`{"order":`+strconv.Itoa(i)+`}`)))
			}
			prefix := fmt.Sprintf("idemwm-kill-%d:", rand.Uint64())
			cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
			cmd.Env = append(os.Environ(), "IDEMWM_STAGE="+stage, "IDEMWM_TOPIC="+topic, "IDEMWM_PREFIX="+prefix)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			want := "RAN order-2"
			if stage == "ack" {
				want = "SETTLED order-3 done"
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() && sc.Text() != want {
			}
			if stage == "handler" {
				// Kill once order-1's outcome is recorded.
				e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease})
				req := idem.Request{Operation: "ship", Key: "order-1"}
				id, _ := req.Identity()
				waitFor(t, 10*time.Second, "order-1 recorded", func() bool {
					st, err := e.Status(t.Context(), id.StoreKey)
					return err == nil && st.Status == idem.StatusCompleted
				})
			}
			_ = cmd.Process.Kill() // SIGKILL
			_ = cmd.Wait()

			var (
				mu   sync.Mutex
				runs = map[string]int{}
				done = map[string]bool{}
			)
			e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: killLease})
			r := newRouter(t)
			_, err = idemwatermill.AddConsumerHandler(r, e, &idemwatermill.Config{
				Operation: "ship", MetadataKey: "Idem-Key",
				Settled: func(m *message.Message, v consume.Verdict) {
					if v.Action == consume.Done {
						mu.Lock()
						done[m.Metadata.Get("Idem-Key")] = true
						mu.Unlock()
					}
				},
			}, "ship", topic, s.subscriber("g", "second", killLease), func(m *message.Message) error {
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

// Watermill's own Deduplicator and idemwatermill side by side, on one
// message published twice (a producer's retry: same payload, same key):
// the Deduplicator remembers in its process's memory, so a copy consumed
// after a restart, or by another replica, runs again; idem's record is in
// the store (Redis), and the copy is replayed.
func TestSideBySideWithDeduplicator(t *testing.T) {
	t.Parallel()
	s := newStreams(t)
	prefix := fmt.Sprintf("idemwm-dedup-%d:", rand.Uint64())
	e := newEngine(t, redisStore(t, prefix), idem.Config{Lease: 30 * time.Second})
	mws := map[string]func(t *testing.T) message.HandlerMiddleware{
		"watermill deduplicator": func(t *testing.T) message.HandlerMiddleware {
			repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return (&middleware.Deduplicator{Repository: repo}).Middleware
		},
		"idem": func(t *testing.T) message.HandlerMiddleware {
			mw, err := idemwatermill.Middleware(e, &idemwatermill.Config{Operation: "ship-" + strings.ReplaceAll(t.Name(), "/", "-"), MetadataKey: "Idem-Key"})
			if err != nil {
				t.Fatal(err)
			}
			return mw
		},
	}
	want := map[string]int{"watermill deduplicator": 2, "idem": 1}
	for _, situation := range []string{"restart", "second replica"} {
		for name, newMW := range mws {
			t.Run(situation+"/"+name, func(t *testing.T) {
				topic := s.topic()
				var (
					mu   sync.Mutex
					runs int
					seen int
				)
				// consumer runs a router of consumer in group "g" with mw,
				// until stopped.
				consumer := func(consumer string, mw message.HandlerMiddleware) (stop func()) {
					r := newRouter(t)
					// A closed subscriber's reader may still take one
					// message before it ends (watermill-redisstream): it
					// stays pending on that consumer until the live one
					// claims it.
					h := r.AddConsumerHandler("ship", topic, s.subscriber("g", consumer, 300*time.Millisecond), func(*message.Message) error {
						mu.Lock()
						runs++
						mu.Unlock()
						return nil
					})
					// Outermost, the first middleware given: counts every
					// copy, whether the handler ran or not.
					h.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
						return func(m *message.Message) ([]*message.Message, error) {
							out, err := h(m)
							mu.Lock()
							seen++
							mu.Unlock()
							return out, err
						}
					}, mw)
					return runRouter(t, r)
				}
				copyOf := func() *message.Message { return msg("order-42", []byte(`{"order":42}`)) }
				handled := func(n int) func() bool {
					return func() bool { mu.Lock(); defer mu.Unlock(); return seen == n }
				}

				mwA := newMW(t)
				stopA := consumer("a", mwA)
				s.publish(topic, copyOf())
				waitFor(t, 10*time.Second, "the first copy", handled(1))
				stopA()
				switch situation {
				case "restart":
					// The same consumer again, in a new process: a new
					// middleware.
					consumer("a", newMW(t))
				case "second replica":
					// Another replica of the service, with its own
					// middleware; a's is still in memory, unseen by it.
					consumer("b", newMW(t))
				}
				s.publish(topic, copyOf())
				waitFor(t, 10*time.Second, "the second copy", handled(2))
				mu.Lock()
				defer mu.Unlock()
				if runs != want[name] {
					t.Errorf("the handler ran %d times, want %d", runs, want[name])
				}
			})
		}
	}
}
