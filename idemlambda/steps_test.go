package idemlambda_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// TestTimedOutInvocationsSteps: an invocation that finished the step
// "charge" and was ended at its deadline (here: never returns, as a frozen
// Lambda does) leaves its key claimed until that deadline, its lease.
// Under Rerun, the retry after the deadline (another instance: another
// engine on the same store) resumes after the charge: charge ran once,
// email once. Under Hold, the retry gets ErrHeld and runs nothing.
func TestTimedOutInvocationsSteps(t *testing.T) {
	for _, hold := range []bool{false, true} {
		name := "rerun"
		if hold {
			name = "hold"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New(&memstore.Config{SweepInterval: -1})
				defer mem.Close()
				var charges, emails atomic.Int32
				frozen, charged := make(chan struct{}), make(chan struct{})
				handler := func(first bool) func(ctx context.Context, p []byte) ([]byte, error) {
					return func(ctx context.Context, p []byte) ([]byte, error) {
						id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { charges.Add(1); return "ch_1", nil })
						if err != nil {
							return nil, err
						}
						if first {
							close(charged)
							<-frozen // ended at its deadline: it never returns in time
							return nil, errors.New("ended")
						}
						if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) { emails.Add(1); return true, nil }); err != nil {
							return nil, err
						}
						return []byte(`"` + id + `"`), nil
					}
				}
				instance := func(first bool) lambda.Handler {
					eng, err := idem.New(mem, &idem.Config{Logger: quiet, HoldCrashed: hold})
					if err != nil {
						t.Fatal(err)
					}
					h, err := idemlambda.WrapRaw(eng, "order", handler(first), nil)
					if err != nil {
						t.Fatal(err)
					}
					return h
				}
				first := make(chan error, 1)
				go func() {
					_, err := instance(true).Invoke(invocationCtx(t), []byte(`{"id":"o-1"}`))
					first <- err
				}()
				<-charged
				time.Sleep(time.Minute + time.Second) // fake time: past the first invocation's deadline
				out, err := instance(false).Invoke(invocationCtx(t), []byte(`{"id":"o-1"}`))
				close(frozen)
				<-first
				if hold {
					if !errors.Is(err, idem.ErrHeld) || charges.Load() != 1 || emails.Load() != 0 {
						t.Fatalf("retry under Hold: %q, %v; charge %d, email %d; want ErrHeld and nothing run again", out, err, charges.Load(), emails.Load())
					}
					return
				}
				if err != nil || string(out) != `"ch_1"` || charges.Load() != 1 || emails.Load() != 1 {
					t.Fatalf("retry: %q, %v; charge %d, email %d; want the recorded charge, and each step once", out, err, charges.Load(), emails.Load())
				}
			})
		})
	}
}
