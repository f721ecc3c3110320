package idemsfn_test

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func reconciler(t testing.TB, s *idemsfn.Starter, cfg *idemsfn.ReconcilerConfig) *idemsfn.Reconciler {
	t.Helper()
	rc, err := idemsfn.NewReconciler(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

func TestReconcilerNeedsALister(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	e, err := idem.New(faultstore.New(mem), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := idemsfn.New(e, newFakeSFN(), idemsfn.Config{StateMachineArn: machineArn, Operation: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemsfn.NewReconciler(s, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("NewReconciler = %v", err)
	}
}

func TestReconcilerRunOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute, OrphanGrace: 30 * time.Second, OrphanPolicy: idemsfn.OrphanFail})
	start := func(k string) fakeExec {
		t.Helper()
		got, err := s.Start(ctx, req(k), nil)
		if err != nil {
			t.Fatal(err)
		}
		return api.byArn(got.ExecutionArn)
	}
	start("running")
	done, failedX, aborted, timedOut := start("done"), start("failed"), start("aborted"), start("timed-out")
	api.finish(done.name, types.ExecutionStatusSucceeded, `{"receipt":"r-1"}`, "", "")
	api.finish(failedX.name, types.ExecutionStatusFailed, "", "PaymentDeclined", "card expired")
	api.finish(aborted.name, types.ExecutionStatusAborted, "", "", "")
	api.finish(timedOut.name, types.ExecutionStatusTimedOut, "", "States.Timeout", "no heartbeat")
	// An orphan whose execution started; one whose execution never did.
	api.startFault = func(int) (error, bool) { return errors.New("timeout"), true }
	if _, err := s.Start(ctx, req("orphan-started"), nil); !errors.Is(err, idemsfn.ErrStartUnknown) {
		t.Fatal(err)
	}
	api.startFault = func(int) (error, bool) { return errors.New("timeout"), false }
	if _, err := s.Start(ctx, req("orphan-lost"), nil); !errors.Is(err, idemsfn.ErrStartUnknown) {
		t.Fatal(err)
	}
	api.startFault = nil
	// Another operation's record is not this reconciler's.
	if _, err := r.e.Begin(ctx, idem.Request{Operation: "refunds", Key: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	rc := reconciler(t, s, &idemsfn.ReconcilerConfig{PageSize: 2})

	rep, err := rc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (idemsfn.Report{Listed: 7, Waiting: 5, OrphansWaiting: 2}); rep != want {
		t.Fatalf("before anything is due: %+v, want %+v", rep, want)
	}
	r.clock.Advance(time.Minute)
	rep, err = rc.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (idemsfn.Report{Listed: 7, Extended: 1, Completed: 1, Failed: 3, Adopted: 1, OrphansFailed: 1}); rep != want {
		t.Fatalf("%+v, want %+v", rep, want)
	}
	for k, want := range map[string]idem.Status{"running": idem.StatusInProgress, "done": idem.StatusCompleted, "failed": idem.StatusFailed,
		"aborted": idem.StatusFailed, "orphan-started": idem.StatusInProgress, "orphan-lost": idem.StatusFailed} {
		if st := r.status(t, k); st.Status != want {
			t.Errorf("%s: %s, want %s", k, st.Status, want)
		}
	}
	if st := r.status(t, "running"); !st.LeaseUntil.Equal(r.clock.Now().Add(time.Minute)) {
		t.Errorf("running: expected completion %v, want %v", st.LeaseUntil, r.clock.Now().Add(time.Minute))
	}
	if st := r.status(t, "done"); string(st.Result) != `{"receipt":"r-1"}` || st.Ref != done.arn {
		t.Errorf("done: %+v", st)
	}
	if st := r.status(t, "failed"); st.Err.Code != "PaymentDeclined" || st.Err.Message != "card expired" {
		t.Errorf("failed: %+v", st.Err)
	}
	if st := r.status(t, "aborted"); st.Err.Code != "States.ABORTED" || st.Err.Message != "Step Functions execution ABORTED" {
		t.Errorf("aborted: %+v", st.Err)
	}
	if st := r.status(t, "timed-out"); st.Err.Code != "States.Timeout" || st.Err.Message != "no heartbeat" {
		t.Errorf("timed-out: %+v", st.Err)
	}
	if st := r.status(t, "orphan-started"); st.Ref == "" {
		t.Error("orphan-started: not attached")
	}
	if st := r.status(t, "orphan-lost"); st.Err.Code != idemsfn.CodeOrphan {
		t.Errorf("orphan-lost: %+v", st.Err)
	}
	if n := api.executions(idemsfn.ExecutionName(storeKey(t, "orphan-lost"))); n != 0 {
		t.Errorf("OrphanFail started %d executions", n)
	}
}

func TestReconcilerRestartsOrphans(t *testing.T) {
	t.Parallel()
	for _, withInput := range []bool{false, true} {
		r := newRig(t, nil)
		api := newFakeSFN()
		cfg := idemsfn.Config{}
		if withInput {
			cfg.RestartInput = func(_ context.Context, k idem.StoreKey) (any, error) {
				return map[string]string{"key": k.String()}, nil
			}
		}
		s := r.starter(t, api, machineArn, cfg)
		if _, err := r.e.Begin(ctx, req("o-1"), &idem.BeginOptions{ExpectedCompletion: time.Hour}); err != nil {
			t.Fatal(err)
		}
		r.clock.Advance(time.Minute)
		rep, err := reconciler(t, s, nil).RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !withInput {
			if rep != (idemsfn.Report{Listed: 1, OrphansWaiting: 1}) || api.count("start") != 0 {
				t.Errorf("no RestartInput: %+v, %d starts", rep, api.count("start"))
			}
			continue
		}
		if rep != (idemsfn.Report{Listed: 1, Restarted: 1}) {
			t.Errorf("%+v", rep)
		}
		x := api.only()
		if env := envelope(t, x.input); !jsonEqual(t, env.Input, json.RawMessage(`{"key":"`+storeKey(t, "o-1").String()+`"}`)) {
			t.Errorf("input %s", env.Input)
		}
		if st := r.status(t, "o-1"); st.Ref != x.arn {
			t.Errorf("ref %q", st.Ref)
		}
	}
}

// Run reconciles at once and then every Interval of the engine's clock,
// and stops on Close (TestMain's goleak proves its goroutines ended).
func TestReconcilerRun(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute})
	got, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan idemsfn.Report)
	// The interval is the record's expected completion: the clock's
	// Advance fires the next run at the timer's own time (the first run's
	// + Interval), which must be past the record's lease; with a shorter
	// interval the run could read the clock before Advance reached its
	// end and find the record still waiting.
	rc := reconciler(t, s, &idemsfn.ReconcilerConfig{Interval: time.Minute, OnRun: func(rep idemsfn.Report, err error) {
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}})
	ran := make(chan error, 1)
	go func() { ran <- rc.Run(ctx) }()
	if rep := <-reports; rep.Waiting != 1 {
		t.Fatalf("first run: %+v", rep)
	}
	api.finish(api.only().name, types.ExecutionStatusSucceeded, `"ok"`, "", "")
	waitTimer(r.clock)
	r.clock.Advance(time.Minute)
	if rep := <-reports; rep.Completed != 1 {
		t.Fatalf("second run: %+v", rep)
	}
	if st := r.status(t, "o-1"); st.Status != idem.StatusCompleted || st.Ref != got.ExecutionArn {
		t.Errorf("record %+v", st)
	}
	waitTimer(r.clock)
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Errorf("Run after Close = %v", err)
	}
	if err := rc.Run(ctx); !errors.Is(err, idemsfn.ErrClosed) {
		t.Errorf("Run after Close = %v", err)
	}
	// A cancelled context stops it too.
	rc2 := reconciler(t, s, &idemsfn.ReconcilerConfig{OnRun: func(idemsfn.Report, error) {}})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := rc2.Run(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled) = %v", err)
	}
}

// waitTimer returns once a goroutine waits on clock: Run, for its
// interval.
func waitTimer(clock *clocktest.Clock) {
	for clock.Waiters() == 0 {
		runtime.Gosched()
	}
}
