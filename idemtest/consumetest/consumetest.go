// Package consumetest is the table every message consumer runs: the same
// situations (a new message, a replay, a terminal or retryable error, a key
// held elsewhere or held for an operator, a reused key, an uncertain outcome, an outcome write
// refused or failed) delivered through each adapter and its real broker
// (or, for Lambda, real event shapes), each of which must settle the
// message by the verdict the consume package gives. idemnats, idemamqp,
// idemkafka (on franz-go's kfake emulator) and idemlambda run it.
//
// [BatchHoldsItsClaims] and [BatchSkipsLapsedClaims] are the scenarios of a
// consumer's batch path with two members of a group on the real broker
// (each adapter gives a [Member]): a batch whose tail waits behind a slow
// head keeps its tail's claims, and a tail whose claims lapsed anyway does
// not run. idemnats and idemamqp run them.
//
// [RecordIsFound] is the find scenario every consumer runs (idemnats,
// idemamqp, idemkafka, idemwatermill): a record made through the adapter
// is found in the console and with `idemctl find` from what the producer
// sent. [KillMidHandler] is the kill scenario: a consumer process
// (a child re-run of the test binary, [KillChild]) SIGKILLed in a handler
// or in an ack, and a consumer that gets what it left running again only
// what was cut off. [ZombieHandler] is the zombie scenario: a consumer
// process stopped in its handler past its lease, its message and key
// taken over by another, its effect and outcome write then refused.
// idemnats, idemamqp, idemkafka and idemwatermill run both.
// [KillBetweenSteps] is the steps scenario: a consumer process SIGKILLed
// between two steps ([idem.Step]) of its handler, and the consumer that
// gets the redelivery resuming after them; idemnats and idemamqp run it
// (docs/consumers.md lists what each adapter runs).
// Test-only.
package consumetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// Fixture is one case's world: the consumer's engine over a store that
// can be made to fail.
type Fixture struct {
	Engine *idem.Engine
	Store  *faultstore.Store
	// Operation is the operation name the adapter must use.
	Operation string
}

// Deliver delivers one message with key and payload through the adapter,
// whose handler calls handle, and returns the verdict the adapter settled
// it by, once it has. The adapter's configuration must use f.Engine and
// f.Operation, key the message by key, and fingerprint payload.
type Deliver func(t *testing.T, f *Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict

// Case is one situation.
type Case struct {
	Name string
	Want consume.Action
	run  func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict
}

// Cases are the situations every consumer is held to.
func Cases() []Case {
	ok := func(context.Context) error { return nil }
	once := func(handle func(context.Context) error) func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
		return func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			return d(t, f, key, []byte(`{"n":1}`), handle)
		}
	}
	// twice delivers a first copy with first, then the message with
	// payload, whose handler must not run.
	twice := func(first func(context.Context) error, payload string) func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
		return func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			d(t, f, key, []byte(`{"n":1}`), first)
			return d(t, f, key, []byte(payload), func(context.Context) error {
				t.Error("the handler ran for a copy whose key was already used")
				return nil
			})
		}
	}
	terminal := func(context.Context) error { return idem.Terminal(errors.New("card declined"), "declined") }
	return []Case{
		{"NewMessage", consume.Done, once(ok)},
		{"Replayed", consume.Done, twice(ok, `{"n":1}`)},
		{"TerminalError", consume.DeadLetter, once(terminal)},
		{"ReplayedTerminalError", consume.DeadLetter, twice(terminal, `{"n":1}`)},
		{"RetryableError", consume.Retry, once(func(context.Context) error { return errors.New("downstream timeout") })},
		{"KeyReusedWithAnotherPayload", consume.DeadLetter, twice(ok, `{"n":2}`)},
		{"Uncertain", consume.Leave, once(func(context.Context) error {
			return idem.Uncertain(errors.New("connection reset after the request was sent"))
		})},
		{"HeldElsewhere", consume.RetryAfter, func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			// A first copy's handler runs until the second copy is settled.
			running, release := make(chan struct{}), make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				d(t, f, key, []byte(`{"n":1}`), func(context.Context) error {
					close(running)
					<-release
					return nil
				})
			})
			<-running
			v := d(t, f, key, []byte(`{"n":1}`), func(context.Context) error {
				t.Error("the handler ran while another copy held the key")
				return nil
			})
			close(release)
			wg.Wait()
			return v
		}},
		{"OutcomeWriteRefused", consume.Leave, func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			// Another consumer takes the key over while the handler runs
			// (as if this one had outlived its lease): the store refuses
			// this holder's Complete.
			return d(t, f, key, []byte(`{"n":1}`), func(ctx context.Context) error {
				c, ok := idem.FromContext(ctx)
				if !ok {
					return errors.New("consumetest: the handler runs without a claim")
				}
				rec, err := f.Store.Get(ctx, c.Key)
				if err != nil {
					return err
				}
				now := time.Now().Add(time.Minute).UnixMilli() // past the lease
				res, err := f.Store.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "another consumer", Fingerprint: rec.Fingerprint,
					Now: now, LeaseUntil: now + 30_000, ExpiresAt: now + 3_600_000})
				if err != nil || !res.Acquired {
					t.Errorf("taking the key over: %+v %v", res, err)
				}
				return nil
			})
		}},
		{"HeldForAnOperator", consume.DeadLetter, func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			// A first copy's consumer dies holding the key under the
			// takeover policy Hold: while its handler runs, the record is
			// replaced by a held claim of "a crashed consumer" whose lease
			// has already passed (the first copy's own Complete is then
			// refused). The next copy meets a key held for an operator.
			d(t, f, key, []byte(`{"n":1}`), func(ctx context.Context) error {
				c, ok := idem.FromContext(ctx)
				if !ok {
					return errors.New("consumetest: the handler runs without a claim")
				}
				rec, err := f.Store.Get(ctx, c.Key)
				if err != nil {
					return err
				}
				now := time.Now()
				at := now.Add(time.Minute).UnixMilli() // past the first copy's lease
				res, err := f.Store.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "a crashed consumer", Fingerprint: rec.Fingerprint,
					Now: at, LeaseUntil: now.Add(-time.Second).UnixMilli(), ExpiresAt: at + 3_600_000, Hold: true})
				if err != nil || !res.Acquired {
					t.Errorf("planting the held claim: %+v %v", res, err)
				}
				return nil
			})
			v := d(t, f, key, []byte(`{"n":1}`), func(context.Context) error {
				t.Error("the handler ran for a key held for an operator")
				return nil
			})
			if !errors.Is(v.Err, idem.ErrHeld) {
				t.Errorf("settled with %v, want idem.ErrHeld", v.Err)
			}
			return v
		}},
		{"OutcomeWriteFailed", consume.Done, func(t *testing.T, f *Fixture, d Deliver, key string) consume.Verdict {
			// The store fails the message's Complete for all of
			// WriteTimeout after the handler ran (the other messages of a
			// batch are recorded).
			v := d(t, f, key, []byte(`{"n":1}`), func(ctx context.Context) error {
				c, ok := idem.FromContext(ctx)
				if !ok {
					return errors.New("consumetest: the handler runs without a claim")
				}
				f.Store.FailKeys("complete", func(k string) error {
					if k != c.Key {
						return nil
					}
					return fmt.Errorf("connection refused: %w", store.ErrUnavailable)
				})
				return nil
			})
			if !errors.Is(v.Err, consume.ErrOutcomeNotRecorded) {
				t.Errorf("settled with %v, want consume.ErrOutcomeNotRecorded: the outcome write did not fail", v.Err)
			}
			return v
		}},
	}
}

var seq atomic.Int64

// Run runs every case through deliver, each on a fresh in-memory store and
// engine (Wait 0, the default, so that a key held elsewhere answers at once;
// WriteTimeout 200ms, so that a failed outcome write gives up soon).
func Run(t *testing.T, deliver Deliver) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			m := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { m.Close() })
			fs := faultstore.New(m)
			e, err := idem.New(fs, &idem.Config{WriteTimeout: 200 * time.Millisecond, Lease: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			f := &Fixture{Engine: e, Store: fs, Operation: fmt.Sprintf("consumetest-%d", seq.Add(1))}
			got := c.run(t, f, deliver, fmt.Sprintf("key-%d", seq.Add(1)))
			if got.Action != c.Want {
				t.Fatalf("settled as %v (%v), want %v", got.Action, got.Err, c.Want)
			}
		})
	}
}
