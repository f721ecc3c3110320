package idemsfn_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
)

// statusEvent is a stand-in for the EventBridge "Step Functions Execution
// Status Change" event of an execution, synthesized from what a Starter
// started: stepfunctions-local sends no events at all, so every test of
// HandleEvent makes its own, with the fields and encoding AWS documents
// (input and output are JSON text in strings; error and cause null unless
// the execution failed).
func statusEvent(arn, sm, name, status, input string, output, errName, cause *string) idemsfn.Event {
	return idemsfn.Event{
		Version: "0", ID: "315c1398-40ff-a850-213b-158f73e60175", DetailType: idemsfn.EventDetailType, Source: idemsfn.EventSource,
		Account: "123456789012", Time: time.Now().UTC().Truncate(time.Second), Region: "us-east-1", Resources: []string{arn},
		Detail: idemsfn.EventDetail{
			ExecutionArn: arn, StateMachineArn: sm, Name: name, Status: status, StartDate: time.Now().UnixMilli(),
			Input: &input, Output: output, Error: errName, Cause: cause,
			InputDetails: &idemsfn.EventPayload{Included: true}, OutputDetails: &idemsfn.EventPayload{Included: output != nil},
		},
	}
}

func TestHandleEventMalformed(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	s := r.starter(t, newFakeSFN(), machineArn, idemsfn.Config{})
	good := statusEvent(machineArn[:strings.LastIndexByte(machineArn, ':')]+":x", machineArn, "x", "RUNNING", "{}", nil, nil, nil)
	for name, mutate := range map[string]func(*idemsfn.Event){
		"source":          func(e *idemsfn.Event) { e.Source = "aws.ec2" },
		"detail-type":     func(e *idemsfn.Event) { e.DetailType = "Step Functions State Machine Status Change" },
		"no execution":    func(e *idemsfn.Event) { e.Detail.ExecutionArn = "" },
		"no status":       func(e *idemsfn.Event) { e.Detail.Status = "" },
		"unknown status":  func(e *idemsfn.Event) { e.Detail.Status = "PAUSED" },
		"no machine":      func(e *idemsfn.Event) { e.Detail.StateMachineArn = "" },
		"bad machine ARN": func(e *idemsfn.Event) { e.Detail.StateMachineArn = "orders" },
	} {
		ev := good
		mutate(&ev)
		if _, err := s.HandleEvent(ctx, ev); !errors.Is(err, idemsfn.ErrMalformedEvent) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, raw := range []string{`{`, `[]`, `{"time":"yesterday"}`} {
		var ee *idemsfn.EventError
		if _, err := s.HandleEventJSON(ctx, []byte(raw)); !errors.As(err, &ee) {
			t.Errorf("%s: %v", raw, err)
		}
	}
}

// The events of executions that are not a Starter's own are ignored.
func TestHandleEventIgnoresOthers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	got, err := s.Start(ctx, req("o-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	x := api.only()
	out := `{"ok":true}`
	other, _ := idem.NewStoreKey("refunds", "", []byte("o-1"))
	otherEnv, _ := json.Marshal(idemsfn.Envelope{Idem: idemsfn.Claim{Key: other.String(), Fence: "1"}})
	for name, ev := range map[string]idemsfn.Event{
		"another state machine": statusEvent(x.arn, machineArn+"2", x.name, "SUCCEEDED", x.input, &out, nil, nil),
		"another name":          statusEvent(x.arn+"b", machineArn, x.name+"b", "SUCCEEDED", x.input, &out, nil, nil),
		"no envelope":           statusEvent(x.arn, machineArn, x.name, "SUCCEEDED", `{"a":1}`, &out, nil, nil),
		"another operation":     statusEvent(x.arn, machineArn, idemsfn.ExecutionName(other), "SUCCEEDED", string(otherEnv), &out, nil, nil),
	} {
		h, err := s.HandleEvent(ctx, ev)
		if err != nil || h.Action != idemsfn.ActionIgnored || h.Reason == "" {
			t.Errorf("%s: %+v, %v", name, h, err)
		}
	}
	// A version or alias of the state machine is the same state machine.
	h, err := s.HandleEvent(ctx, statusEvent(x.arn, machineArn+":3", x.name, "SUCCEEDED", x.input, &out, nil, nil))
	if err != nil || h.Action != idemsfn.ActionCompleted || h.Key != got.State.Key {
		t.Errorf("versioned: %+v, %v", h, err)
	}
}

// An event without its input or output (over EventBridge's size limit)
// is completed from DescribeExecution.
func TestHandleEventReadsWhatTheEventLeftOut(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	if _, err := s.Start(ctx, req("o-1"), nil); err != nil {
		t.Fatal(err)
	}
	x := api.only()
	api.finish(x.name, types.ExecutionStatusSucceeded, `{"big":true}`, "", "")
	ev := statusEvent(x.arn, machineArn, x.name, "SUCCEEDED", "", nil, nil, nil)
	ev.Detail.Input, ev.Detail.InputDetails.Included = nil, false
	raw, _ := json.Marshal(ev)
	h, err := s.HandleEventJSON(ctx, raw)
	if err != nil || h.Action != idemsfn.ActionCompleted {
		t.Fatalf("%+v, %v", h, err)
	}
	if st := r.status(t, "o-1"); string(st.Result) != `{"big":true}` {
		t.Errorf("result %s", st.Result)
	}
	if api.count("describe") != 1 {
		t.Errorf("%d DescribeExecution calls", api.count("describe"))
	}
}

// A RUNNING event attaches the execution to an orphan claim.
func TestHandleEventRunningAttachesOrphan(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{})
	api.startFault = func(int) (error, bool) { return errors.New("timeout"), true }
	if _, err := s.Start(ctx, req("o-1"), nil); !errors.Is(err, idemsfn.ErrStartUnknown) {
		t.Fatal(err)
	}
	x := api.only()
	h, err := s.HandleEvent(ctx, statusEvent(x.arn, machineArn, x.name, "RUNNING", x.input, nil, nil, nil))
	if err != nil || h.Action != idemsfn.ActionAttached {
		t.Fatalf("%+v, %v", h, err)
	}
	if st := r.status(t, "o-1"); st.Ref != x.arn {
		t.Errorf("ref %q", st.Ref)
	}
	h, err = s.HandleEvent(ctx, statusEvent(x.arn, machineArn, x.name, "RUNNING", x.input, nil, nil, nil))
	if err != nil || h.Action != idemsfn.ActionIgnored {
		t.Errorf("again: %+v, %v", h, err)
	}
}
