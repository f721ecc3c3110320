package idemsfn_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/smithy-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store"
)

// These tests run the Starter against fakeSFN (AWS's semantics, no
// server); the same paths run against stepfunctions-local in
// local_test.go.

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	for _, c := range []struct {
		name string
		cfg  idemsfn.Config
		want string
	}{
		{"no state machine", idemsfn.Config{Operation: "orders"}, "StateMachineArn"},
		{"activity ARN", idemsfn.Config{StateMachineArn: "arn:aws:states:us-east-1:1:activity:x", Operation: "orders"}, "StateMachineArn"},
		{"no operation", idemsfn.Config{StateMachineArn: machineArn}, "Operation"},
		{"bad operation", idemsfn.Config{StateMachineArn: machineArn, Operation: "a b"}, "Operation"},
		{"expected completion over expiry", idemsfn.Config{StateMachineArn: machineArn, Operation: "orders", ExpectedCompletion: 48 * time.Hour}, "ExpectedCompletion"},
		{"negative grace", idemsfn.Config{StateMachineArn: machineArn, Operation: "orders", OrphanGrace: -1}, "OrphanGrace"},
		{"unknown policy", idemsfn.Config{StateMachineArn: machineArn, Operation: "orders", OrphanPolicy: 7}, "OrphanPolicy"},
	} {
		_, err := idemsfn.New(r.e, api, c.cfg)
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidConfig about %s", c.name, err, c.want)
		}
	}
	s, err := idemsfn.New(r.e, api, idemsfn.Config{StateMachineArn: machineArn + ":prod", Operation: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.ExpectedCompletion != idemsfn.DefaultExpectedCompletion || c.OrphanGrace != idemsfn.DefaultOrphanGrace || c.OrphanPolicy != idemsfn.OrphanRestart {
		t.Errorf("defaults: %+v", c)
	}
}

func TestStartNewKey(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})

	got, err := s.Start(ctx, req("o-1"), map[string]int{"amount": 5})
	if err != nil {
		t.Fatal(err)
	}
	x := api.only()
	if !got.Acquired || got.Adopted || got.ExecutionArn != x.arn || got.State.Ref != x.arn || got.State.Status != idem.StatusInProgress {
		t.Fatalf("Start = %+v, execution %s", got, x.arn)
	}
	if n := r.fs.Total(); n != 2 || r.fs.Calls("claim") != 1 || r.fs.Calls("extend") != 1 {
		t.Errorf("a new call made %d store calls (claim %d, extend %d), want 2: claim and attach", n, r.fs.Calls("claim"), r.fs.Calls("extend"))
	}
	key := storeKey(t, "o-1")
	if x.name != idemsfn.ExecutionName(key) {
		t.Errorf("execution name %s, want %s", x.name, idemsfn.ExecutionName(key))
	}
	env := envelope(t, x.input)
	tok, err := idem.ParseToken(env.Idem.Token, "orders")
	if err != nil || tok.Key.String() != key.String() || env.Idem.Key != key.String() || env.Idem.Fence != "1" || env.Idem.Owner != tok.Owner {
		t.Errorf("envelope %+v, token %+v, %v", env.Idem, tok, err)
	}
	if string(env.Input) != `{"amount":5}` {
		t.Errorf("input %s", env.Input)
	}
	if st := r.status(t, "o-1"); st.Ref != x.arn || st.Fence != tok.Fence || st.Owner != tok.Owner {
		t.Errorf("record %+v", st)
	}
}

func TestStartDuplicateWhileRunning(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	first, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	calls, apiCalls := r.fs.Total(), api.total()
	dup, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if dup.Acquired || dup.ExecutionArn != first.ExecutionArn || dup.State.Status != idem.StatusInProgress {
		t.Errorf("duplicate = %+v", dup)
	}
	if n := r.fs.Total() - calls; n != 1 {
		t.Errorf("a duplicate made %d store calls, want 1", n)
	}
	if n := api.total() - apiCalls; n != 0 {
		t.Errorf("a duplicate made %d Step Functions calls, want 0", n)
	}
	if _, err := s.Start(ctx, idem.Request{Operation: "orders", Key: "o-1", Payload: []byte(`{"other":1}`)}, nil); !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("another payload: %v", err)
	}
	if _, err := s.Start(ctx, idem.Request{Operation: "refunds", Key: "o-1"}, nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("another operation: %v", err)
	}
}

func TestStartInput(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	for k, c := range map[string]struct {
		input any
		want  string
	}{
		"payload": {nil, `{"order":"payload"}`},
		"raw":     {json.RawMessage(`[1, 2]`), `[1,2]`},
		"value":   {struct{ N int }{3}, `{"N":3}`},
	} {
		got, err := s.Start(ctx, req(k), c.input)
		if err != nil {
			t.Fatal(err)
		}
		if env := envelope(t, api.byArn(got.ExecutionArn).input); !jsonEqual(t, env.Input, []byte(c.want)) {
			t.Errorf("%s: input %s, want %s", k, env.Input, c.want)
		}
	}
	if _, err := s.Start(ctx, req("bad"), json.RawMessage(`{`)); err == nil {
		t.Error("invalid raw input accepted")
	}
	if _, err := s.Start(ctx, req("chan"), make(chan int)); err == nil {
		t.Error("unencodable input accepted")
	}
	if _, err := r.e.Status(ctx, storeKey(t, "bad")); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("an input error claimed the key: %v", err)
	}
}

func TestStartReplaysOutcome(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	ok, err := s.Start(ctx, req("ok"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, tokenOf(t, api, ok.ExecutionArn), json.RawMessage(`{"receipt":"r-1"}`)); err != nil {
		t.Fatal(err)
	}
	bad, err := s.Start(ctx, req("bad"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, tokenOf(t, api, bad.ExecutionArn), "PaymentDeclined", "card expired"); err != nil {
		t.Fatal(err)
	}
	calls, apiCalls := r.fs.Total(), api.total()
	got, err := s.Start(ctx, req("ok"), nil)
	if err != nil || got.State.Status != idem.StatusCompleted || string(got.Output) != `{"receipt":"r-1"}` || got.ExecutionArn != ok.ExecutionArn {
		t.Errorf("replay = %+v, %v", got, err)
	}
	got, err = s.Start(ctx, req("bad"), nil)
	var te *idem.TerminalError
	if !errors.As(err, &te) || te.Code != "PaymentDeclined" || te.Message != "card expired" || !te.Replayed || got.State.Status != idem.StatusFailed {
		t.Errorf("failure replay = %+v, %v", got, err)
	}
	if n := r.fs.Total() - calls; n != 2 {
		t.Errorf("two replays made %d store calls, want 2", n)
	}
	if api.total() != apiCalls {
		t.Error("a replay called Step Functions")
	}
}

// tokenOf is the token in the input of the execution arn.
func tokenOf(t testing.TB, api *fakeSFN, arn string) string {
	t.Helper()
	return envelope(t, api.byArn(arn).input).Idem.Token
}

func TestStartRefusedReleases(t *testing.T) {
	t.Parallel()
	for name, fault := range map[string]error{
		"invalid input":         &types.InvalidExecutionInput{Message: new("too large")},
		"no such state machine": &types.StateMachineDoesNotExist{Message: new("gone")},
		"access denied":         &smithy.GenericAPIError{Code: "AccessDeniedException", Message: "no"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			api := newFakeSFN()
			api.startFault = func(n int) (error, bool) {
				if n == 1 {
					return fault, false
				}
				return nil, false
			}
			s := r.starter(t, api, machineArn, idemsfn.Config{})
			var se *idemsfn.StartError
			got, err := s.Start(ctx, req("o-1"), nil)
			if !errors.Is(err, idemsfn.ErrStartRefused) || !errors.As(err, &se) || !se.Released || !errors.Is(err, fault) || got.State != nil || !got.Acquired {
				t.Fatalf("Start = %+v, %v; want a released StartError", got, err)
			}
			if _, err := r.e.Status(ctx, storeKey(t, "o-1")); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("claim kept: %v", err)
			}
			got, err = s.Start(ctx, req("o-1"), nil)
			if err != nil || !got.Acquired || got.ExecutionArn == "" {
				t.Errorf("retry = %+v, %v", got, err)
			}
		})
	}
}

func TestStartUnknownKeepsClaimUntilOrphanGrace(t *testing.T) {
	t.Parallel()
	for name, applied := range map[string]bool{"not started": false, "started, reply lost": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			api := newFakeSFN()
			api.startFault = func(n int) (error, bool) {
				if n == 1 {
					return &smithy.GenericAPIError{Code: "ServiceUnavailable", Message: "try later", Fault: smithy.FaultServer}, applied
				}
				return nil, false
			}
			s := r.starter(t, api, machineArn, idemsfn.Config{OrphanGrace: 30 * time.Second})
			_, err := s.Start(ctx, req("o-1"), nil)
			var se *idemsfn.StartError
			if !errors.Is(err, idemsfn.ErrStartUnknown) || !errors.As(err, &se) || se.Released {
				t.Fatalf("Start = %v, want ErrStartUnknown", err)
			}
			st := r.status(t, "o-1")
			if st.Status != idem.StatusInProgress || st.Ref != "" {
				t.Fatalf("record %+v, want the claim kept without execution", st)
			}
			// Within the grace the starter may still be at work: no start.
			r.clock.Advance(29 * time.Second)
			got, err := s.Start(ctx, req("o-1"), nil)
			if err != nil || got.ExecutionArn != "" || got.State.Status != idem.StatusInProgress || api.count("start") != 1 {
				t.Fatalf("within the grace: %+v, %v, %d starts", got, err, api.count("start"))
			}
			r.clock.Advance(time.Second)
			got, err = s.Start(ctx, req("o-1"), nil)
			if err != nil || !got.Repaired || got.Acquired || got.ExecutionArn == "" || got.State.Ref != got.ExecutionArn {
				t.Fatalf("after the grace: %+v, %v", got, err)
			}
			x := api.only()
			if got.ExecutionArn != x.arn {
				t.Errorf("attached %s, execution %s", got.ExecutionArn, x.arn)
			}
			// Started or not, the second StartExecution succeeds: AWS
			// answers a start with the name and input of a running
			// execution with that execution (stepfunctions-local answers
			// ExecutionAlreadyExists, which local_test.go covers).
			if got.Adopted || api.count("describe") != 0 || api.count("start") != 2 {
				t.Errorf("Adopted %v after %d starts and %d describes", got.Adopted, api.count("start"), api.count("describe"))
			}
			// The repaired start carries the orphan's own claim.
			if env := envelope(t, x.input); env.Idem.Fence != "1" || env.Idem.Owner != st.Owner {
				t.Errorf("envelope %+v, claim %d %s", env.Idem, st.Fence, st.Owner)
			}
		})
	}
}

// An execution with the key's name exists (its starter died after
// StartExecution): the next start adopts it, through DescribeExecution or,
// when the execution ARN is not the one built from the state machine's
// (stepfunctions-local puts region "local" in every one), ListExecutions.
func TestStartAdoptsExistingExecution(t *testing.T) {
	t.Parallel()
	for _, region := range []string{"", "local"} {
		t.Run("region="+region, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, nil)
			api := newFakeSFN()
			api.region = region
			for i := range 5 { // others to page through
				api.put(machineArn, "other-"+string(rune('a'+i)), `{}`)
			}
			s := r.starter(t, api, machineArn, idemsfn.Config{})
			b, err := r.e.Begin(ctx, req("o-1"), &idem.BeginOptions{ExpectedCompletion: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			input, _ := json.Marshal(idemsfn.Envelope{Idem: idemsfn.Claim{Token: b.Token.String(), Key: b.Token.Key.String(), Fence: "1", Owner: b.Token.Owner}, Input: json.RawMessage(`{"n":1}`)})
			arn := api.put(machineArn, idemsfn.ExecutionName(b.Token.Key), string(input))
			r.clock.Advance(time.Minute)
			got, err := s.Start(ctx, req("o-1"), json.RawMessage(`{"n":2}`))
			if err != nil || !got.Adopted || !got.Repaired || got.ExecutionArn != arn || got.State.Ref != arn {
				t.Fatalf("Start = %+v, %v; want %s adopted", got, err, arn)
			}
			if n := api.executions(idemsfn.ExecutionName(b.Token.Key)); n != 1 {
				t.Errorf("%d executions", n)
			}
			if lists := api.count("list"); (region == "") != (lists == 0) {
				t.Errorf("region %q: %d ListExecutions calls", region, lists)
			}
		})
	}
}

func TestStartAdoptsFinishedExecution(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	api.startFault = func(n int) (error, bool) {
		if n == 1 {
			return errors.New("connection reset"), true
		}
		return nil, false
	}
	if _, err := s.Start(ctx, req("o-1"), nil); !errors.Is(err, idemsfn.ErrStartUnknown) {
		t.Fatal(err)
	}
	api.finish(api.only().name, types.ExecutionStatusSucceeded, `{"receipt":"r-9"}`, "", "")
	r.clock.Advance(time.Minute)
	got, err := s.Start(ctx, req("o-1"), json.RawMessage(`{"changed":true}`))
	if err != nil || !got.Adopted || got.State.Status != idem.StatusCompleted || string(got.Output) != `{"receipt":"r-9"}` {
		t.Fatalf("Start = %+v, %v", got, err)
	}
}

func TestStartForeignExecution(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	api.put(machineArn, idemsfn.ExecutionName(storeKey(t, "o-1")), `{"not":"ours"}`)
	_, err := s.Start(ctx, req("o-1"), nil)
	var fe *idemsfn.ForeignExecutionError
	if !errors.Is(err, idemsfn.ErrForeignExecution) || !errors.As(err, &fe) {
		t.Fatalf("Start = %v", err)
	}
	if st := r.status(t, "o-1"); st.Status != idem.StatusInProgress || st.Ref != "" {
		t.Errorf("record %+v", st)
	}
}

// The attach finds the record settled: the workflow completed before its
// starter attached it.
func TestStartWorkflowFasterThanAttach(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	r.fs.FailWith("extend", func(n int64) error {
		if n == 1 {
			x := api.only()
			if err := s.Complete(ctx, envelope(t, x.input).Idem.Token, json.RawMessage(`"done"`)); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	got, err := s.Start(ctx, req("o-1"), nil)
	if err != nil || got.State.Status != idem.StatusCompleted || string(got.Output) != `"done"` || got.ExecutionArn != api.only().arn {
		t.Fatalf("Start = %+v, %v", got, err)
	}
}

// A second claim (after the expected completion) adopts the same
// execution; the completion then comes with the first claim's token and
// is accepted.
func TestTakeoverAdoptsSameExecution(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute})
	first, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	tokA := tokenOf(t, api, first.ExecutionArn)
	r.clock.Advance(time.Minute)
	second, err := s.Start(ctx, req("o-1"), nil)
	if err != nil || !second.Acquired || !second.Adopted || second.ExecutionArn != first.ExecutionArn || second.State.Fence != 2 {
		t.Fatalf("takeover = %+v, %v", second, err)
	}
	if n := api.executions(idemsfn.ExecutionName(storeKey(t, "o-1"))); n != 1 {
		t.Fatalf("%d executions", n)
	}
	if err := s.Complete(ctx, tokA, json.RawMessage(`{"ok":true}`)); err != nil {
		t.Fatalf("completion from the first claim's token: %v", err)
	}
	st := r.status(t, "o-1")
	if st.Status != idem.StatusCompleted || st.Fence != 2 || string(st.Result) != `{"ok":true}` {
		t.Errorf("record %+v", st)
	}
}

// The record changes between reading it and completing through its claim:
// the completion reads it again.
func TestCompleteRetriesOnRace(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute})
	first, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	tokA := tokenOf(t, api, first.ExecutionArn)
	r.clock.Advance(time.Minute)
	if _, err := s.Start(ctx, req("o-1"), nil); err != nil { // claim 2
		t.Fatal(err)
	}
	// The write through claim 2 meets claim 3, which took over just then.
	r.fs.FailWith("complete", func(n int64) error {
		if n == 2 {
			r.clock.Advance(time.Minute)
			if got, err := s.Start(ctx, req("o-1"), nil); err != nil || got.State.Fence != 3 {
				t.Errorf("claim 3: %+v, %v", got, err)
			}
		}
		return nil
	})
	if err := s.Complete(ctx, tokA, json.RawMessage(`1`)); err != nil {
		t.Fatal(err)
	}
	if st := r.status(t, "o-1"); st.Status != idem.StatusCompleted || st.Fence != 3 {
		t.Errorf("record %+v", st)
	}
	if n := r.fs.Calls("complete"); n != 3 {
		t.Errorf("%d complete calls, want 3", n)
	}
}

func TestCompleteAndFail(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	start := func(k string) string {
		got, err := s.Start(ctx, req(k), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tokenOf(t, api, got.ExecutionArn)
	}
	out := json.RawMessage(`{"n":1}`)

	tok := start("a")
	if err := s.Complete(ctx, tok, out); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, tok, out); err != nil {
		t.Errorf("duplicate completion: %v", err)
	}
	if err := s.Fail(ctx, tok, "E", "late"); !errors.Is(err, idemsfn.ErrSettled) {
		t.Errorf("Fail after Complete: %v", err)
	}
	if st := r.status(t, "a"); st.Status != idem.StatusCompleted {
		t.Errorf("record %+v", st)
	}

	tok = start("b")
	if err := s.Fail(ctx, tok, "", "boom"); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, tok, "", "boom"); err != nil {
		t.Errorf("duplicate failure: %v", err)
	}
	if err := s.Complete(ctx, tok, out); !errors.Is(err, idemsfn.ErrSettled) {
		t.Errorf("Complete after Fail: %v", err)
	}
	if st := r.status(t, "b"); st.Status != idem.StatusFailed || st.Err.Code != "States.FAILED" || st.Err.Message != "boom" {
		t.Errorf("record %+v %+v", st, st.Err)
	}

	tok = start("c")
	if err := s.Complete(ctx, tok, json.RawMessage(`{`)); err == nil {
		t.Error("invalid JSON output accepted")
	}
	if err := s.Complete(ctx, "garbage", out); !errors.Is(err, idem.ErrInvalidToken) {
		t.Errorf("garbage token: %v", err)
	}
	other, _ := idem.ParseToken(tok, "")
	other.Key, _ = idem.NewStoreKey("refunds", "", []byte("c"))
	if err := s.Complete(ctx, other.String(), out); !errors.Is(err, idem.ErrInvalidToken) {
		t.Errorf("token of another operation: %v", err)
	}
	gone, _ := idem.ParseToken(tok, "")
	gone.Key = storeKey(t, "never")
	if err := s.Complete(ctx, gone.String(), out); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("token of an absent key: %v", err)
	}
}

func TestExecutionArnPrefixWithQualifier(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn+":live", idemsfn.Config{})
	got, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "arn:aws:states:us-east-1:123456789012:execution:orders:" + idemsfn.ExecutionName(storeKey(t, "o-1")); got.ExecutionArn != want {
		t.Errorf("ARN %s, want %s", got.ExecutionArn, want)
	}
}

var _ store.Lister = counted{}
