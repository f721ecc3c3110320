package idemsfn

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/seed-a1b882c0/idem"
)

// The source and detail-type of Step Functions' EventBridge events about
// executions.
const (
	EventSource     = "aws.states"
	EventDetailType = "Step Functions Execution Status Change"
)

// Event is an EventBridge "Step Functions Execution Status Change" event,
// as a rule with the pattern {"source": ["aws.states"], "detail-type":
// ["Step Functions Execution Status Change"]} delivers it (to a Lambda
// function, an SQS queue, ...).
type Event struct {
	Version    string      `json:"version"`
	ID         string      `json:"id"`
	DetailType string      `json:"detail-type"`
	Source     string      `json:"source"`
	Account    string      `json:"account"`
	Time       time.Time   `json:"time"`
	Region     string      `json:"region"`
	Resources  []string    `json:"resources"`
	Detail     EventDetail `json:"detail"`
}

// EventDetail is the detail of an [Event]. Input and Output are JSON
// documents carried as strings, null when absent or too large for the
// event (InputDetails or OutputDetails then say Included false).
type EventDetail struct {
	ExecutionArn    string        `json:"executionArn"`
	StateMachineArn string        `json:"stateMachineArn"`
	Name            string        `json:"name"`
	Status          string        `json:"status"`
	StartDate       int64         `json:"startDate"`
	StopDate        *int64        `json:"stopDate"`
	Input           *string       `json:"input"`
	Output          *string       `json:"output"`
	InputDetails    *EventPayload `json:"inputDetails"`
	OutputDetails   *EventPayload `json:"outputDetails"`
	Error           *string       `json:"error"`
	Cause           *string       `json:"cause"`
	RedriveCount    int           `json:"redriveCount"`
}

// EventPayload says whether an event carries a payload.
type EventPayload struct {
	Included bool `json:"included"`
}

// Handled is what [Starter.HandleEvent] did.
type Handled struct {
	Action Action
	// Key is the store key the execution works for, when known.
	Key string
	// ExecutionArn is the event's execution.
	ExecutionArn string
	// Reason says why an event was ignored.
	Reason string
	// State is the record as read, when it was read and not written.
	State *idem.State
}

// HandleEventJSON decodes an EventBridge event and handles it as
// [Starter.HandleEvent] does; bytes that are not such an event fail with
// an [*EventError].
func (s *Starter) HandleEventJSON(ctx context.Context, raw []byte) (Handled, error) {
	var ev Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return Handled{}, &EventError{Reason: "not a JSON EventBridge event: " + err.Error()}
	}
	return s.HandleEvent(ctx, ev)
}

// HandleEvent records the outcome an "Execution Status Change" event
// reports: SUCCEEDED completes the key with the execution's output;
// FAILED, TIMED_OUT and ABORTED mark it FAILED with the event's error (or
// "States." + status) as code and its cause as message. The key comes
// from the execution's input (the [Envelope]); an execution whose name is
// not the key's [ExecutionName], whose input is no envelope of
// Config.Operation, or of another state machine, is not ours: ignored.
// Events are delivered at least once and in no set order, so:
//
//   - a duplicate, or an event for a record already settled the same way,
//     is a no-op (ActionDuplicate);
//   - a FAILED event for a COMPLETED record changes nothing (ActionSettled);
//   - a SUCCEEDED event for a FAILED record whose execution is this one (a
//     redrive: Step Functions redrives a failed execution under the same
//     ARN, for 14 days after it failed) completes it (ActionRedriven);
//   - a RUNNING event attaches the execution to an orphan claim of its key
//     (ActionAttached), so it is found even if its starter died before
//     attaching it.
//
// When the event left the input or output out (over the event's size
// limit), they are read with DescribeExecution. The outcome is written
// through whichever claim of the key is IN_PROGRESS (see
// [Starter.Complete]). Malformed events fail with an [*EventError].
func (s *Starter) HandleEvent(ctx context.Context, ev Event) (Handled, error) {
	d := ev.Detail
	switch {
	case ev.Source != EventSource || ev.DetailType != EventDetailType:
		return Handled{}, &EventError{Reason: "source " + quote(ev.Source) + " and detail-type " + quote(ev.DetailType) +
			" are not " + EventSource + " and " + EventDetailType}
	case d.ExecutionArn == "" || d.StateMachineArn == "" || d.Status == "":
		return Handled{}, &EventError{Reason: "detail lacks executionArn, stateMachineArn or status"}
	}
	h := Handled{ExecutionArn: d.ExecutionArn}
	switch d.Status {
	case "RUNNING", "PENDING_REDRIVE", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED":
	default:
		return h, &EventError{Reason: "unknown execution status " + quote(d.Status)}
	}
	if base, _, err := parseStateMachineArn(d.StateMachineArn); err != nil {
		return h, &EventError{Reason: err.Error()}
	} else if base != s.base {
		h.Action, h.Reason = ActionIgnored, "execution of another state machine"
		return h, nil
	}
	input, output := d.Input, d.Output
	if input == nil || (d.Status == "SUCCEEDED" && output == nil) {
		desc, err := s.describe(ctx, d.ExecutionArn)
		if errors.Is(err, errNoExecution) {
			h.Action, h.Reason = ActionIgnored, "the event carries no input and the execution does not exist"
			return h, nil
		}
		if err != nil {
			return h, err
		}
		input, output = desc.Input, desc.Output
	}
	_, key, err := ParseEnvelope([]byte(aws.ToString(input)))
	if err != nil {
		h.Action, h.Reason = ActionIgnored, "input is not an idemsfn envelope"
		return h, nil
	}
	h.Key = key.String()
	name := d.Name
	if name == "" {
		name = d.ExecutionArn[strings.LastIndexByte(d.ExecutionArn, ':')+1:]
	}
	switch {
	case key.Operation != s.cfg.Operation:
		h.Action, h.Reason = ActionIgnored, "key of operation "+key.Operation
		return h, nil
	case name != ExecutionName(key):
		h.Action, h.Reason = ActionIgnored, "execution name "+quote(name)+" is not its key's"
		return h, nil
	}
	var o outcome
	switch d.Status {
	case "RUNNING", "PENDING_REDRIVE":
		return s.attachOrphan(ctx, key, workToken(input), h)
	case "SUCCEEDED":
		out := aws.ToString(output)
		if out != "" && !json.Valid([]byte(out)) {
			return h, &EventError{Reason: "output is not JSON"}
		}
		o = succeeded(json.RawMessage(out), d.ExecutionArn)
	default:
		o = failed(d.Status, aws.ToString(d.Error), aws.ToString(d.Cause), d.ExecutionArn)
	}
	h.Action, h.State, err = s.settle(ctx, key, idem.Token{}, workToken(input), o)
	return h, err
}

// attachOrphan attaches a running execution to its key's claim when that
// claim has none.
func (s *Starter) attachOrphan(ctx context.Context, key idem.StoreKey, work idem.Token, h Handled) (Handled, error) {
	st, err := s.e.Status(ctx, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		h.Action = ActionGone
		return h, nil
	case err != nil:
		return h, err
	}
	h.State = st
	if st.Status != idem.StatusInProgress || st.Ref != "" {
		h.Action, h.Reason = ActionIgnored, "the record is "+st.Status.String()+" with execution "+quote(st.Ref)
		return h, nil
	}
	err = s.e.Attach(ctx, st.Token().WithTraceOf(work), h.ExecutionArn)
	if errors.Is(err, idem.ErrStaleToken) {
		h.Action, h.Reason = ActionIgnored, "the record changed meanwhile"
		return h, nil
	}
	if err != nil {
		return h, err
	}
	h.Action, h.State = ActionAttached, nil
	return h, nil
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
