package idemsfn_test

import (
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// These tests run against stepfunctions-local, an emulator that differs
// from AWS (docs/stepfunctions.md, "stepfunctions-local vs AWS"): it sends
// no events (the tests synthesize them: statusEvent), reports no error or
// cause for a failed execution, and answers ExecutionAlreadyExists to
// every start with a used name.

// localRig is a Starter of a fresh activity workflow on stepfunctions-local,
// over a fresh store, with a worker polling its activity.
type localRig struct {
	rig
	c        *sfn.Client
	machine  string
	activity string
	s        *idemsfn.Starter
	tasks    <-chan task
}

func newLocalRig(t testing.TB, newStore func(t testing.TB) store.Store, cfg idemsfn.Config) localRig {
	t.Helper()
	c := sfnClient(t)
	r := newRig(t, newStore(t))
	act := newActivity(t, c)
	l := localRig{rig: r, c: c, activity: act, machine: newMachine(t, c, activityMachine(act))}
	if cfg.ExpectedCompletion == 0 {
		cfg.ExpectedCompletion = time.Minute
	}
	l.s = r.starter(t, c, l.machine, cfg)
	l.tasks = startWorker(t, c, act)
	return l
}

// succeed ends the task as the worker of path (a) does: Step Functions
// gets the result, and so does the key.
func (l localRig) succeed(t testing.TB, tk task, output string) {
	t.Helper()
	if _, err := l.c.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: aws.String(tk.token), Output: aws.String(output)}); err != nil {
		t.Fatal(err)
	}
	if err := l.s.Complete(ctx, tk.env.Idem.Token, json.RawMessage(output)); err != nil {
		t.Fatal(err)
	}
}

// A duplicate during the work gets the same execution in one store round
// trip; after the worker completed the key, the output is replayed.
func TestLocalActivityWorkflow(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{})
		got, err := l.s.Start(ctx, req("o-1"), map[string]int{"amount": 5})
		if err != nil {
			t.Fatal(err)
		}
		if !got.Acquired || got.ExecutionArn == "" || l.fs.Total() != 2 {
			t.Fatalf("Start = %+v with %d store calls, want acquired with 2", got, l.fs.Total())
		}
		tk := next(t, l.tasks)
		if tk.env.Idem.Key != got.State.Key || string(tk.env.Input) != `{"amount":5}` {
			t.Fatalf("task input %+v", tk.env)
		}
		calls := l.fs.Total()
		dup, err := l.s.Start(ctx, req("o-1"), map[string]int{"amount": 5})
		if err != nil || dup.Acquired || dup.ExecutionArn != got.ExecutionArn || dup.State.Status != idem.StatusInProgress {
			t.Fatalf("duplicate during the work = %+v, %v", dup, err)
		}
		if n := l.fs.Total() - calls; n != 1 {
			t.Errorf("a duplicate made %d store round trips, want 1", n)
		}
		l.succeed(t, tk, `{"receipt":"r-1"}`)
		calls = l.fs.Total()
		replay, err := l.s.Start(ctx, req("o-1"), nil)
		if err != nil || replay.State.Status != idem.StatusCompleted || !jsonEqual(t, replay.Output, []byte(`{"receipt":"r-1"}`)) {
			t.Fatalf("after completion = %+v, %v", replay, err)
		}
		if n := l.fs.Total() - calls; n != 1 {
			t.Errorf("a replay made %d store round trips, want 1", n)
		}
		if d := waitStatus(t, l.c, got.ExecutionArn, "SUCCEEDED"); !jsonEqual(t, []byte(aws.ToString(d.Output)), []byte(`{"receipt":"r-1"}`)) {
			t.Errorf("execution output %s", aws.ToString(d.Output))
		}
		if n := executionsNamed(t, l.c, l.machine, idemsfn.ExecutionName(storeKey(t, "o-1"))); n != 1 {
			t.Errorf("%d executions", n)
		}
	})
}

// The starter died between its claim and StartExecution: after
// OrphanGrace, Starts (even concurrent ones) start the execution once.
func TestLocalOrphanBeforeStart(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{OrphanGrace: 30 * time.Second})
		if _, err := l.e.Begin(ctx, req("o-1"), &idem.BeginOptions{ExpectedCompletion: time.Hour}); err != nil {
			t.Fatal(err)
		}
		// A new process, after the grace.
		s := l.starter(t, l.c, l.machine, idemsfn.Config{OrphanGrace: 30 * time.Second})
		l.clock.Advance(30 * time.Second)
		var wg sync.WaitGroup
		arns := make([]string, 4)
		var repairs atomic.Int32
		for i := range arns {
			wg.Go(func() {
				got, err := s.Start(ctx, req("o-1"), nil)
				if err != nil {
					t.Error(err)
					return
				}
				// A repair, or a duplicate that read the record after one.
				if got.Acquired || got.State.Status != idem.StatusInProgress {
					t.Errorf("Start = %+v, want a repair or a duplicate", got)
				}
				if got.Repaired {
					repairs.Add(1)
				}
				arns[i] = got.ExecutionArn
			})
		}
		wg.Wait()
		if repairs.Load() == 0 {
			t.Error("no Start repaired the orphan")
		}
		for _, a := range arns[1:] {
			if a != arns[0] || a == "" {
				t.Fatalf("ARNs %v", arns)
			}
		}
		if n := executionsNamed(t, l.c, l.machine, idemsfn.ExecutionName(storeKey(t, "o-1"))); n != 1 {
			t.Errorf("%d executions, want exactly 1", n)
		}
		if st := l.status(t, "o-1"); st.Ref != arns[0] || st.Fence != 1 {
			t.Errorf("record %+v", st)
		}
	})
}

// The starter died between StartExecution and attaching the execution:
// a retry (or the reconciler) adopts the execution; still one.
func TestLocalOrphanAfterStart(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		for _, by := range []string{"Start", "Reconciler"} {
			t.Run(by, func(t *testing.T) {
				l := newLocalRig(t, newStore, idemsfn.Config{})
				b, err := l.e.Begin(ctx, req("o-1"), &idem.BeginOptions{ExpectedCompletion: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				name := idemsfn.ExecutionName(b.Token.Key)
				input, _ := json.Marshal(idemsfn.Envelope{Idem: idemsfn.Claim{Token: b.Token.String(), Key: b.Token.Key.String(), Fence: "1", Owner: b.Token.Owner}, Input: json.RawMessage(`{"n":1}`)})
				out, err := l.c.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(l.machine), Name: aws.String(name), Input: aws.String(string(input))})
				if err != nil {
					t.Fatal(err)
				}
				l.clock.Advance(time.Minute)
				if by == "Start" {
					got, err := l.s.Start(ctx, req("o-1"), json.RawMessage(`{"n":1}`))
					if err != nil || !got.Adopted || !got.Repaired || got.ExecutionArn != aws.ToString(out.ExecutionArn) {
						t.Fatalf("Start = %+v, %v", got, err)
					}
				} else {
					rep, err := reconciler(t, l.s, nil).RunOnce(ctx)
					if err != nil || rep != (idemsfn.Report{Listed: 1, Adopted: 1}) {
						t.Fatalf("RunOnce = %+v, %v", rep, err)
					}
				}
				if n := executionsNamed(t, l.c, l.machine, name); n != 1 {
					t.Errorf("%d executions, want exactly 1", n)
				}
				if st := l.status(t, "o-1"); st.Ref != aws.ToString(out.ExecutionArn) {
					t.Errorf("ref %q", st.Ref)
				}
				// The worker of the adopted execution completes the key.
				l.succeed(t, next(t, l.tasks), `"ok"`)
				if st := l.status(t, "o-1"); st.Status != idem.StatusCompleted {
					t.Errorf("record %+v", st)
				}
			})
		}
	})
}

// An activity fails with no Catch, so the execution fails; the key ends
// FAILED through the worker's Fail or through the reconciler, and the
// failure is replayed.
func TestLocalFailedWorkflow(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		for _, by := range []string{"worker", "reconciler"} {
			t.Run(by, func(t *testing.T) {
				l := newLocalRig(t, newStore, idemsfn.Config{})
				got, err := l.s.Start(ctx, req("o-1"), nil)
				if err != nil {
					t.Fatal(err)
				}
				tk := next(t, l.tasks)
				if _, err := l.c.SendTaskFailure(ctx, &sfn.SendTaskFailureInput{TaskToken: aws.String(tk.token),
					Error: aws.String("PaymentDeclined"), Cause: aws.String("card expired")}); err != nil {
					t.Fatal(err)
				}
				code, msg := "PaymentDeclined", "card expired"
				if by == "worker" {
					if err := l.s.Fail(ctx, tk.env.Idem.Token, code, msg); err != nil {
						t.Fatal(err)
					}
				} else {
					waitStatus(t, l.c, got.ExecutionArn, "FAILED")
					l.clock.Advance(time.Minute)
					rep, err := reconciler(t, l.s, nil).RunOnce(ctx)
					if err != nil || rep != (idemsfn.Report{Listed: 1, Failed: 1}) {
						t.Fatalf("RunOnce = %+v, %v", rep, err)
					}
					// stepfunctions-local's DescribeExecution gives no
					// error or cause; AWS's would be stored.
					code, msg = "States.FAILED", "Step Functions execution FAILED"
				}
				_, err = l.s.Start(ctx, req("o-1"), nil)
				var te *idem.TerminalError
				if !errors.As(err, &te) || !te.Replayed || te.Code != code || te.Message != msg {
					t.Fatalf("replay = %v, want %s: %s", err, code, msg)
				}
			})
		}
	})
}

// A second claim (after the expected completion passed) adopts the same
// execution; the completion sent with the first claim's token is accepted.
func TestLocalTakeoverAdoptsSameExecution(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{ExpectedCompletion: time.Minute})
		first, err := l.s.Start(ctx, req("o-1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		tk := next(t, l.tasks)
		l.clock.Advance(time.Minute)
		second, err := l.s.Start(ctx, req("o-1"), nil)
		if err != nil || !second.Acquired || !second.Adopted || second.ExecutionArn != first.ExecutionArn || second.State.Fence != 2 {
			t.Fatalf("takeover = %+v, %v", second, err)
		}
		l.succeed(t, tk, `{"done":1}`) // with claim 1's token
		st := l.status(t, "o-1")
		if st.Status != idem.StatusCompleted || st.Fence != 2 || !jsonEqual(t, st.Result, []byte(`{"done":1}`)) {
			t.Fatalf("record %+v", st)
		}
		if n := executionsNamed(t, l.c, l.machine, idemsfn.ExecutionName(storeKey(t, "o-1"))); n != 1 {
			t.Errorf("%d executions", n)
		}
	})
}

// The reconciler asks the service about executions past their expected
// completion: extends running ones, completes finished ones.
func TestLocalReconciler(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{ExpectedCompletion: time.Minute})
		got, err := l.s.Start(ctx, req("o-1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		rc := reconciler(t, l.s, nil)
		tk := next(t, l.tasks)
		l.clock.Advance(time.Minute)
		if rep, err := rc.RunOnce(ctx); err != nil || rep != (idemsfn.Report{Listed: 1, Extended: 1}) {
			t.Fatalf("while running: %+v, %v", rep, err)
		}
		if st := l.status(t, "o-1"); !st.LeaseUntil.Equal(l.clock.Now().Add(time.Minute)) {
			t.Errorf("expected completion %v", st.LeaseUntil)
		}
		// The worker tells Step Functions only; the reconciler tells idem.
		if _, err := l.c.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: aws.String(tk.token), Output: aws.String(`{"receipt":"r-2"}`)}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, l.c, got.ExecutionArn, "SUCCEEDED")
		if rep, err := rc.RunOnce(ctx); err != nil || rep != (idemsfn.Report{Listed: 1, Waiting: 1}) {
			t.Fatalf("before the new expected completion: %+v, %v", rep, err)
		}
		l.clock.Advance(time.Minute)
		if rep, err := rc.RunOnce(ctx); err != nil || rep != (idemsfn.Report{Listed: 1, Completed: 1}) {
			t.Fatalf("after it: %+v, %v", rep, err)
		}
		replay, err := l.s.Start(ctx, req("o-1"), nil)
		if err != nil || !jsonEqual(t, replay.Output, []byte(`{"receipt":"r-2"}`)) {
			t.Fatalf("replay = %+v, %v", replay, err)
		}
		if rep, err := rc.RunOnce(ctx); err != nil || rep != (idemsfn.Report{}) {
			t.Errorf("nothing left: %+v, %v", rep, err)
		}
	})
}

// Events: stepfunctions-local sends none, so each case synthesizes the
// EventBridge event (statusEvent, a stand-in for EventBridge) of a real
// execution, from its DescribeExecution.
func TestLocalEvents(t *testing.T) {
	t.Parallel()
	forStores(t, func(t *testing.T, newStore func(testing.TB) store.Store) {
		l := newLocalRig(t, newStore, idemsfn.Config{})
		start := func(k string) (*sfn.DescribeExecutionOutput, task) {
			t.Helper()
			got, err := l.s.Start(ctx, req(k), nil)
			if err != nil {
				t.Fatal(err)
			}
			tk := next(t, l.tasks)
			if tk.env.Idem.Key != got.State.Key {
				t.Fatalf("task of %s, want %s", tk.env.Idem.Key, got.State.Key)
			}
			d, err := l.c.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(got.ExecutionArn)})
			if err != nil {
				t.Fatal(err)
			}
			return d, tk
		}
		event := func(d *sfn.DescribeExecutionOutput, status string, output, errName, cause *string) idemsfn.Event {
			return statusEvent(aws.ToString(d.ExecutionArn), aws.ToString(d.StateMachineArn), aws.ToString(d.Name), status, aws.ToString(d.Input), output, errName, cause)
		}
		handle := func(ev idemsfn.Event, want idemsfn.Action) {
			t.Helper()
			raw, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			h, err := l.s.HandleEventJSON(ctx, raw)
			if err != nil || h.Action != want {
				t.Fatalf("%s event: %+v, %v; want %s", ev.Detail.Status, h, err, want)
			}
		}
		wantFailed := func(k, code, msg string) {
			t.Helper()
			st := l.status(t, k)
			if st.Status != idem.StatusFailed || st.Err.Code != code || st.Err.Message != msg {
				t.Fatalf("%s: %+v %+v, want FAILED %s: %s", k, st, st.Err, code, msg)
			}
		}

		// TIMED_OUT (stepfunctions-local enforces no timeout), duplicated.
		d, _ := start("timed-out")
		handle(event(d, "TIMED_OUT", nil, nil, nil), idemsfn.ActionFailed)
		handle(event(d, "TIMED_OUT", nil, nil, nil), idemsfn.ActionDuplicate)
		wantFailed("timed-out", "States.TIMED_OUT", "Step Functions execution TIMED_OUT")

		// FAILED with the error and cause AWS puts in the event.
		d, _ = start("failed")
		handle(event(d, "FAILED", nil, aws.String("PaymentDeclined"), aws.String("card expired")), idemsfn.ActionFailed)
		wantFailed("failed", "PaymentDeclined", "card expired")

		// ABORTED (StopExecution), with a cause.
		d, _ = start("aborted")
		handle(event(d, "ABORTED", nil, nil, aws.String("stopped by an operator")), idemsfn.ActionFailed)
		wantFailed("aborted", "States.ABORTED", "stopped by an operator")

		// SUCCEEDED, for real, delivered twice.
		d, tk := start("succeeded")
		if _, err := l.c.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: aws.String(tk.token), Output: aws.String(`{"receipt":"r-3"}`)}); err != nil {
			t.Fatal(err)
		}
		d = waitStatus(t, l.c, aws.ToString(d.ExecutionArn), "SUCCEEDED")
		handle(event(d, "SUCCEEDED", d.Output, nil, nil), idemsfn.ActionCompleted)
		handle(event(d, "SUCCEEDED", d.Output, nil, nil), idemsfn.ActionDuplicate)
		handle(event(d, "FAILED", nil, nil, nil), idemsfn.ActionSettled) // late and out of order
		if got, err := l.s.Start(ctx, req("succeeded"), nil); err != nil || !jsonEqual(t, got.Output, []byte(`{"receipt":"r-3"}`)) {
			t.Fatalf("replay = %+v, %v", got, err)
		}

		// FAILED, then redriven to success under the same ARN
		// (stepfunctions-local has no RedriveExecution: the execution
		// simply goes on after the synthesized FAILED event).
		d, tk = start("redriven")
		handle(event(d, "FAILED", nil, aws.String("States.TaskFailed"), aws.String("first attempt")), idemsfn.ActionFailed)
		if _, err := l.s.Start(ctx, req("redriven"), nil); !errors.Is(err, idem.ErrTerminal) {
			t.Fatalf("after FAILED: %v", err)
		}
		if _, err := l.c.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: aws.String(tk.token), Output: aws.String(`{"receipt":"r-4"}`)}); err != nil {
			t.Fatal(err)
		}
		// A worker's success does not correct a FAILED record by itself.
		if err := l.s.Complete(ctx, tk.env.Idem.Token, json.RawMessage(`{"receipt":"r-4"}`)); !errors.Is(err, idemsfn.ErrSettled) {
			t.Fatalf("worker's Complete of a FAILED record: %v", err)
		}
		d = waitStatus(t, l.c, aws.ToString(d.ExecutionArn), "SUCCEEDED")
		redrive := event(d, "SUCCEEDED", d.Output, nil, nil)
		redrive.Detail.RedriveCount = 1
		handle(redrive, idemsfn.ActionRedriven)
		handle(redrive, idemsfn.ActionDuplicate)
		if got, err := l.s.Start(ctx, req("redriven"), nil); err != nil || !jsonEqual(t, got.Output, []byte(`{"receipt":"r-4"}`)) {
			t.Fatalf("replay after the redrive = %+v, %v", got, err)
		}

		// A SUCCEEDED event of another execution with the key's name and
		// envelope does not correct the record.
		d, _ = start("other-arn")
		handle(event(d, "FAILED", nil, nil, nil), idemsfn.ActionFailed)
		other := event(d, "SUCCEEDED", aws.String(`1`), nil, nil)
		other.Detail.ExecutionArn += "-other"
		handle(other, idemsfn.ActionSettled)
	})
}

// The two states of DynamoDBCompleteStates pass stepfunctions-local's
// definition check (asl-validator); running them needs AWS (the emulator
// has no service integrations), so dynamodb_test.go runs their update
// through a stand-in.
func TestLocalAcceptsDynamoDBStates(t *testing.T) {
	t.Parallel()
	c := sfnClient(t)
	var states map[string]json.RawMessage
	asl, err := idemsfn.DynamoDBCompleteStates(dynamostore.Config{Table: "idem"})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(asl, &states); err != nil {
		t.Fatal(err)
	}
	states["Work"] = json.RawMessage(`{"Type":"Pass","Result":{"receipt":"r-1"},"ResultPath":"$.output","Next":"` + idemsfn.DynamoDBCompleteStateName + `"}`)
	def, _ := json.Marshal(map[string]any{"StartAt": "Work", "States": states})
	newMachine(t, c, string(def))
}
