// Tests of Step: resuming after a holder that died between two steps, the
// zombie's step refused, the order of steps, what is recorded and what
// is not, and what a step costs in round trips.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// sideEffects counts how often each step's effect ran.
type sideEffects struct{ charge, email, ledger atomic.Int32 }

func (s *sideEffects) counts() [3]int32 {
	return [3]int32{s.charge.Load(), s.email.Load(), s.ledger.Load()}
}

// A holder dies between two steps (it stops renewing its lease after the
// charge, as a killed process does); after the lease a second process
// takes the key over: the charge's recorded result comes back with the
// claim and is returned without running, the email and the ledger write
// run, once. The dead holder, when it wakes as a zombie, cannot record
// its email step: the write is refused (ErrLeaseLost) and changes
// nothing, and its outcome is refused too.
func TestStepResumesAfterTheHolderDiedBetweenSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Lease: 2 * time.Second, RenewInterval: -1, Clock: store.SystemClock{}})
		rescuer := en.another(t, idem.Config{Lease: 2 * time.Second})
		ctx := context.Background()
		var fx sideEffects
		charged, wake := make(chan struct{}), make(chan struct{})
		zombieErr := make(chan error, 1)
		go func() {
			_, err := idem.Do(ctx, en.eng, req("order-1"), func(ctx context.Context) (string, error) {
				id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_1", nil })
				if err != nil {
					return "", err
				}
				close(charged)
				<-wake // dead: no renewal, no write, until the key is taken over
				if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) { fx.email.Add(1); return true, nil }); err != nil {
					return "", err
				}
				return "zombie:" + id, nil
			})
			zombieErr <- err
		}()
		<-charged
		time.Sleep(2 * time.Second) // the lease passes

		claims, steps, gets := en.store.Calls("claim"), en.store.Calls("record_step"), en.store.Calls("get")
		res, err := idem.Do(ctx, rescuer, req("order-1"), func(ctx context.Context) (string, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_2", nil })
			if err != nil {
				return "", err
			}
			if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) { fx.email.Add(1); return true, nil }); err != nil {
				return "", err
			}
			if _, err := idem.Step(ctx, "ledger", func(context.Context) (int, error) { fx.ledger.Add(1); return 7, nil }); err != nil {
				return "", err
			}
			return "done:" + id, nil
		})
		if err != nil || res.Value != "done:ch_1" || res.Fence != 2 {
			t.Fatalf("the takeover: %+v %v, want done:ch_1 (the recorded charge) at fence 2", res, err)
		}
		if got := fx.counts(); got != [3]int32{1, 1, 1} {
			t.Fatalf("effects charge, email, ledger ran %v times, want once each", got)
		}
		// Resuming cost the claim and nothing more: no read; one write per
		// step that ran.
		if c, s, g := en.store.Calls("claim")-claims, en.store.Calls("record_step")-steps, en.store.Calls("get")-gets; c != 1 || s != 2 || g != 0 {
			t.Errorf("the takeover made %d claims, %d step writes, %d reads; want 1, 2, 0", c, s, g)
		}
		rec, err := en.mem.Get(ctx, res.StoreKey)
		if err != nil || rec.Status != store.StatusCompleted || len(rec.Steps) != 0 || string(rec.Result) != `"done:ch_1"` {
			t.Fatalf("record after the takeover: %+v %v, want COMPLETED without steps", rec, err)
		}

		close(wake)
		err = <-zombieErr
		if !errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, store.ErrFenced) {
			t.Fatalf("the zombie's step: %v, want ErrLeaseLost wrapping the store's refusal", err)
		}
		after, _ := en.mem.Get(ctx, res.StoreKey)
		if after.Status != store.StatusCompleted || string(after.Result) != `"done:ch_1"` || len(after.Steps) != 0 || after.Fence != 2 {
			t.Fatalf("the zombie changed the record: %+v", after)
		}
	})
}

// The operation fails with an ordinary error after a step was recorded:
// the claim is not released (that would delete the step) but its lease
// is ended, so the next call takes the key over at once and resumes. A
// retry that calls the steps in another order gets ErrStepOrder and
// runs nothing; the steps stay for the retry that calls them in order.
func TestStepOrderIsChecked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		other := en.another(t, idem.Config{})
		ctx := context.Background()
		var fx sideEffects
		charge := func(ctx context.Context) (string, error) {
			return idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_1", nil })
		}
		email := func(ctx context.Context) (bool, error) {
			return idem.Step(ctx, "email", func(context.Context) (bool, error) { fx.email.Add(1); return true, nil })
		}
		down := errors.New("mail server down")
		_, err := idem.Do(ctx, en.eng, req("order-2"), func(ctx context.Context) (string, error) {
			if _, err := charge(ctx); err != nil {
				return "", err
			}
			return "", down
		})
		if !errors.Is(err, down) {
			t.Fatalf("first run: %v", err)
		}
		key := storeKeyOf(t, req("order-2"))
		rec, err := en.mem.Get(ctx, key)
		if err != nil || rec.Status != store.StatusInProgress || len(rec.Steps) != 1 {
			t.Fatalf("record after an ordinary error: %+v %v, want IN_PROGRESS with its step", rec, err)
		}

		_, err = idem.Do(ctx, other, req("order-2"), func(ctx context.Context) (string, error) {
			if _, err := email(ctx); err != nil { // reordered by a new release
				return "", err
			}
			_, err := charge(ctx)
			return "reordered", err
		})
		if !errors.Is(err, idem.ErrStepOrder) || err == nil || !strings.Contains(err.Error(), `step 0 of`) ||
			!strings.Contains(err.Error(), `is "charge" (recorded before a takeover), but the operation called "email"`) {
			t.Fatalf("steps in another order: %v, want ErrStepOrder at step 0 (charge recorded, email called)", err)
		}
		if got := fx.counts(); got != [3]int32{1, 0, 0} {
			t.Fatalf("after the mismatch effects ran %v times; want the first charge only", got)
		}

		res, err := idem.Do(ctx, other, req("order-2"), func(ctx context.Context) (string, error) {
			id, err := charge(ctx)
			if err != nil {
				return "", err
			}
			_, err = email(ctx)
			return "sent:" + id, err
		})
		if err != nil || res.Value != "sent:ch_1" || res.Fence != 3 {
			t.Fatalf("the retry in order: %+v %v, want sent:ch_1 at fence 3", res, err)
		}
		if got := fx.counts(); got != [3]int32{1, 1, 0} {
			t.Fatalf("effects ran %v times, want the charge and the email once", got)
		}
	})
}

// Engine.Status shows an IN_PROGRESS record's finished steps, in order,
// as recorded (idemctl show and the console read them there); a settled
// record shows none.
func TestStatusShowsTheSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx := context.Background()
		down := errors.New("ledger down")
		run := func(last func(context.Context) (int, error)) error {
			_, err := idem.Do(ctx, en.eng, req("order-9"), func(ctx context.Context) (string, error) {
				if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
					return "", err
				}
				if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) {
					return false, idem.Terminal(errors.New("no such mailbox"), "bounced")
				}); !errors.Is(err, idem.ErrTerminal) {
					return "", fmt.Errorf("the email step: %v, want its terminal error", err)
				}
				_, err := last(ctx)
				return "done", err
			})
			return err
		}
		before := time.Now()
		if err := run(func(context.Context) (int, error) { return 0, down }); !errors.Is(err, down) {
			t.Fatalf("first run: %v", err)
		}
		order := req("order-9")
		id, err := order.Identity()
		if err != nil {
			t.Fatal(err)
		}
		st, err := en.eng.Status(ctx, id.StoreKey)
		if err != nil || st.Status != idem.StatusInProgress || len(st.Steps) != 2 {
			t.Fatalf("Status after the first run: %+v %v, want IN_PROGRESS with two steps", st, err)
		}
		charge, email := st.Steps[0], st.Steps[1]
		if charge.Name != "charge" || string(charge.Result) != `"ch_1"` || charge.Err != nil || charge.At != store.Millis(before) {
			t.Errorf("step 0: %+v, want charge with its result, recorded at %d", charge, store.Millis(before))
		}
		if email.Name != "email" || email.Result != nil || email.Err == nil || email.Err.Code != "bounced" || email.Err.Message != "no such mailbox" {
			t.Errorf("step 1: %+v, want email with its terminal error", email)
		}

		if err := run(func(context.Context) (int, error) { return 7, nil }); err != nil {
			t.Fatal(err)
		}
		if st, err := en.eng.Status(ctx, id.StoreKey); err != nil || st.Status != idem.StatusCompleted || st.Steps != nil {
			t.Fatalf("Status once completed: %+v %v, want COMPLETED without steps", st, err)
		}
	})
}

// A step's ordinary error is not recorded: the step must be called again
// before any other (a retry inside the operation), and runs again. A
// terminal error is recorded and returned again, without running, by the
// holder that resumes.
func TestStepErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx := context.Background()
		var fx sideEffects
		flaky := errors.New("connection reset")
		_, err := idem.Do(ctx, en.eng, req("order-3"), func(ctx context.Context) (string, error) {
			if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "", flaky }); !errors.Is(err, flaky) {
				t.Errorf("a failing step: %v, want its error", err)
			}
			_, err := idem.Step(ctx, "email", func(context.Context) (bool, error) { fx.email.Add(1); return true, nil })
			if !errors.Is(err, idem.ErrStepOrder) || err == nil || !strings.Contains(err.Error(), `"charge", failed and was not recorded, but the operation called "email"`) {
				t.Errorf("another step after a failed one: %v, want ErrStepOrder naming the failed charge", err)
			}
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_1", nil })
			if err != nil || id != "ch_1" {
				t.Errorf("the charge called again: %q %v", id, err)
			}
			_, err = idem.Step(ctx, "email", func(context.Context) (bool, error) {
				fx.email.Add(1)
				return false, idem.Terminal(errors.New("mailbox full"), "mail_refused")
			})
			var te *idem.TerminalError
			if !errors.As(err, &te) || te.Code != "mail_refused" || te.Replayed {
				t.Errorf("a terminal step error: %v", err)
			}
			return "", errors.New("crashed after the email") // ordinary: the key is kept for a retry
		})
		if err == nil {
			t.Fatal("the first run succeeded")
		}
		rec, _ := en.mem.Get(ctx, storeKeyOf(t, req("order-3")))
		if len(rec.Steps) != 2 || rec.Steps[0].Name != "charge" || rec.Steps[1].Err == nil || rec.Steps[1].Err.Code != "mail_refused" {
			t.Fatalf("recorded steps: %+v, want the charge and the email's terminal error", rec.Steps)
		}
		res, err := idem.Do(ctx, en.eng, req("order-3"), func(ctx context.Context) (string, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_2", nil })
			if err != nil {
				return "", err
			}
			_, err = idem.Step(ctx, "email", func(context.Context) (bool, error) { fx.email.Add(1); return true, nil })
			var te *idem.TerminalError
			if !errors.As(err, &te) || te.Code != "mail_refused" || te.Message != "mailbox full" || !te.Replayed {
				t.Errorf("the recorded terminal error: %v", err)
			}
			return "resumed:" + id, nil
		})
		if err != nil || res.Value != "resumed:ch_1" {
			t.Fatalf("the resumed run: %+v %v", res, err)
		}
		if got := fx.counts(); got != [3]int32{2, 1, 0} {
			t.Fatalf("effects ran %v times; want the charge twice (failed, then ran), the email once", got)
		}
	})
}

// A panic after a step keeps the step, as an ordinary error does.
func TestStepKeptAfterAPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx := context.Background()
		var fx sideEffects
		func() {
			defer func() { _ = recover() }()
			_, _ = idem.Do(ctx, en.eng, req("order-4"), func(ctx context.Context) (string, error) {
				_, _ = idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_1", nil })
				panic("boom")
			})
		}()
		res, err := idem.Do(ctx, en.eng, req("order-4"), func(ctx context.Context) (string, error) {
			return idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_2", nil })
		})
		if err != nil || res.Value != "ch_1" || fx.charge.Load() != 1 {
			t.Fatalf("after a panic: %+v %v, charge ran %d times; want ch_1, once", res, err, fx.charge.Load())
		}
	})
}

// A step write that fails on a transient fault is retried while the write
// timeout lasts; one whose reply was lost is not recorded twice. A
// completed operation's replay never reads or writes its steps.
func TestStepWritesAreRetriedAndReplaysIgnoreSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx := context.Background()
		en.store.FailWith("record_step", func(n int64) error {
			if n == 1 {
				return store.ErrUnavailable
			}
			return nil
		})
		en.store.LoseReplies("record_step", func(n int64) error {
			if n == 3 {
				return store.ErrUnavailable
			}
			return nil
		})
		runs := 0
		op := func(ctx context.Context) (string, error) {
			runs++
			a, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil })
			if err != nil {
				return "", err
			}
			b, err := idem.Step(ctx, "email", func(context.Context) (string, error) { return "sent", nil })
			return a + "+" + b, err
		}
		res, err := idem.Do(ctx, en.eng, req("order-5"), op)
		if err != nil || res.Value != "ch_1+sent" {
			t.Fatalf("Do: %+v %v", res, err)
		}
		if n := en.store.Calls("record_step"); n != 4 {
			t.Errorf("%d step writes, want 4 (each step retried once)", n)
		}
		before := en.store.Total()
		res, err = idem.Do(ctx, en.eng, req("order-5"), op)
		if err != nil || !res.Replayed || res.Value != "ch_1+sent" || runs != 1 {
			t.Fatalf("replay: %+v %v, runs %d", res, err, runs)
		}
		if n := en.store.Total() - before; n != 1 || en.store.Calls("record_step") != 4 {
			t.Errorf("the replay made %d store calls (want the claim only)", n)
		}
	})
}

// The misuses of Step, each a clear typed error with fn not run; and Step
// without a claim (a disabled engine) runs fn as it is.
func TestStepMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ran := false
	fn := func(context.Context) (int, error) { ran = true; return 1, nil }
	if _, err := idem.Step(ctx, "charge", fn); !errors.Is(err, idem.ErrNoOperation) || ran {
		t.Errorf("outside an operation: %v (ran %v), want ErrNoOperation", err, ran)
	}

	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	plain, err := idem.New(struct{ store.Store }{mem}, nil) // hides the Stepper power
	if err != nil {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, plain, req("k"), func(ctx context.Context) (int, error) { return idem.Step(ctx, "charge", fn) })
	if !errors.Is(err, idem.ErrStepsUnsupported) || ran {
		t.Errorf("over a store without steps: %v (ran %v), want ErrStepsUnsupported", err, ran)
	}

	en := setup(t, idem.Config{})
	_, err = idem.Do(ctx, en.eng, req("names"), func(ctx context.Context) (int, error) {
		for _, name := range []string{"", strings.Repeat("x", idem.MaxStepNameLen+1), "bad\xff"} {
			if _, err := idem.Step(ctx, name, fn); !errors.Is(err, idem.ErrInvalidArgument) {
				t.Errorf("step name %q: %v, want ErrInvalidArgument", name, err)
			}
		}
		_, err := idem.Step(ctx, "outer", func(ctx context.Context) (int, error) {
			return idem.Step(ctx, "inner", fn) // steps run one at a time
		})
		if !errors.Is(err, idem.ErrStepOrder) {
			t.Errorf("a step inside a step: %v, want ErrStepOrder", err)
		}
		return 0, nil
	})
	if err != nil || ran {
		t.Errorf("misuses: %v, ran %v", err, ran)
	}

	off := setup(t, idem.Config{Disabled: true})
	if _, err := idem.Do(ctx, off.eng, req("k"), func(ctx context.Context) (int, error) { return idem.Step(ctx, "charge", fn) }); err != nil || !ran {
		t.Errorf("disabled engine: %v, ran %v; want fn run", err, ran)
	}
}

// Steps count toward the record's size limit (Config.MaxResultBytes): a
// step that would pass it is refused with a terminal error of code
// CodeResultTooLarge; returned by the operation, it marks the key FAILED,
// so that no retry runs the step again.
func TestStepOverTheSizeLimit(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{MaxResultBytes: 40})
	ctx := context.Background()
	runs := 0
	op := func(ctx context.Context) (string, error) {
		runs++
		if _, err := idem.Step(ctx, "small", func(context.Context) (string, error) { return strings.Repeat("a", 20), nil }); err != nil {
			return "", err
		}
		return idem.Step(ctx, "big", func(context.Context) (string, error) { return strings.Repeat("b", 20), nil })
	}
	_, err := idem.Do(ctx, en.eng, req("k"), op)
	var te *idem.TerminalError
	if !errors.As(err, &te) || te.Code != idem.CodeResultTooLarge || !errors.Is(err, idem.ErrResultTooLarge) {
		t.Fatalf("steps over the limit: %v, want a terminal CodeResultTooLarge", err)
	}
	if _, err := idem.Do(ctx, en.eng, req("k"), op); !errors.Is(err, idem.ErrResultTooLarge) || runs != 1 {
		t.Fatalf("retry: %v after %d runs; want the stored error, no second run", err, runs)
	}
}

// storeKeyOf is the store key of r.
func storeKeyOf(t *testing.T, r idem.Request) string {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey.String()
}

// Steps work in the items of a batch as in Do: an item that fails after a
// finished step keeps it, and the retry (here through Do) resumes; an item
// that succeeds is completed with the batch's outcomes, its steps dropped.
func TestStepsInABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}})
		ctx := context.Background()
		var charges [2]atomic.Int32
		down := errors.New("ledger down")
		_, errs := idem.DoBatch(ctx, en.eng, ids(t, "b-0", "b-1"), nil, func(ctx context.Context, i int) (string, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { charges[i].Add(1); return "ch_b", nil })
			if err != nil || i == 0 {
				return "", errors.Join(err, down)
			}
			return "ok:" + id, nil
		})
		if !errors.Is(errs[0], down) || errs[1] != nil {
			t.Fatalf("batch: %v", errs)
		}
		if rec, err := en.mem.Get(ctx, storeKeyOf(t, req("b-1"))); err != nil || rec.Status != store.StatusCompleted || len(rec.Steps) != 0 {
			t.Fatalf("the completed item: %+v %v, want COMPLETED without steps", rec, err)
		}
		res, err := idem.Do(ctx, en.eng, req("b-0"), func(ctx context.Context) (string, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { charges[0].Add(1); return "ch_again", nil })
			return "ok:" + id, err
		})
		if err != nil || res.Value != "ok:ch_b" || charges[0].Load() != 1 || charges[1].Load() != 1 {
			t.Fatalf("the retry of the failed item: %+v %v, charges %d %d; want the recorded charge, each once", res, err, charges[0].Load(), charges[1].Load())
		}
	})
}

// Under Hold, an operation that fails with an ordinary error after a
// finished step leaves its key for a person, as a crash would: its lease
// is ended (not released, which would delete its steps), and a held key
// past its lease is not taken over. The next call gets ErrHeld and runs
// nothing; the step is still in the record for the operator to see.
func TestOrdinaryErrorAfterAStepUnderHoldWaitsForAPerson(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		en := setup(t, idem.Config{Clock: store.SystemClock{}, HoldCrashed: true})
		ctx := context.Background()
		var fx sideEffects
		_, err := idem.Do(ctx, en.eng, req("order-held"), func(ctx context.Context) (string, error) {
			if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_1", nil }); err != nil {
				return "", err
			}
			return "", errors.New("the ledger is down") // ordinary
		})
		if err == nil {
			t.Fatal("the first run succeeded")
		}
		time.Sleep(time.Minute) // fake time: well past any lease
		_, err = idem.Do(ctx, en.eng, req("order-held"), func(ctx context.Context) (string, error) {
			return idem.Step(ctx, "charge", func(context.Context) (string, error) { fx.charge.Add(1); return "ch_2", nil })
		})
		if !errors.Is(err, idem.ErrHeld) {
			t.Fatalf("the next call: %v, want ErrHeld", err)
		}
		if n := fx.charge.Load(); n != 1 {
			t.Fatalf("the charge ran %d times, want once", n)
		}
		rec, _ := en.mem.Get(ctx, storeKeyOf(t, req("order-held")))
		if rec == nil || rec.Status != store.StatusInProgress || !rec.Hold || len(rec.Steps) != 1 || rec.Steps[0].Name != "charge" {
			t.Fatalf("the record: %+v, want IN_PROGRESS, held, with the charge", rec)
		}
	})
}
