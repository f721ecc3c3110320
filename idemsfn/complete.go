package idemsfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/seed-a1b882c0/idem"
)

// Action is what a completion, an event or the [Reconciler] did with a
// key.
type Action string

// The actions.
const (
	// ActionCompleted: the record became COMPLETED with the output.
	ActionCompleted Action = "completed"
	// ActionFailed: the record became FAILED with the error.
	ActionFailed Action = "failed"
	// ActionRedriven: a FAILED record became COMPLETED because its
	// execution succeeded after all (Step Functions redrives a failed
	// execution under the same ARN).
	ActionRedriven Action = "redriven"
	// ActionDuplicate: the record held this outcome already; nothing was
	// written.
	ActionDuplicate Action = "duplicate"
	// ActionSettled: the record holds the other outcome and was left as
	// it is.
	ActionSettled Action = "settled"
	// ActionGone: the key has no live record (expired, or released);
	// nothing was written.
	ActionGone Action = "gone"
	// ActionAttached: a RUNNING execution was attached to its key's
	// orphan claim.
	ActionAttached Action = "attached"
	// ActionIgnored: the event is not about an execution this Starter
	// started, or its status settles nothing.
	ActionIgnored Action = "ignored"
)

// outcome is how an execution ended.
type outcome struct {
	succeeded bool
	output    json.RawMessage
	err       *idem.TerminalError
	// arn is the execution, "" when unknown (a completion through a task's
	// token).
	arn string
}

func succeeded(output json.RawMessage, arn string) outcome {
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	return outcome{succeeded: true, output: output, arn: arn}
}

// failed is the outcome of an execution that ended with status (FAILED,
// TIMED_OUT, ABORTED) and, when the service says, an error name and a
// cause. The stored code is the error name, else "States." + status.
func failed(status, errName, cause, arn string) outcome {
	if errName == "" {
		errName = "States." + status
	}
	if cause == "" {
		cause = "Step Functions execution " + status
	}
	return outcome{err: &idem.TerminalError{Code: errName, Message: cause}, arn: arn}
}

// outcomeOf is the outcome of a finished execution as described.
func outcomeOf(d *sfn.DescribeExecutionOutput) outcome {
	arn := aws.ToString(d.ExecutionArn)
	if d.Status == types.ExecutionStatusSucceeded {
		return succeeded(json.RawMessage(aws.ToString(d.Output)), arn)
	}
	return failed(string(d.Status), aws.ToString(d.Error), aws.ToString(d.Cause), arn)
}

// settleAttempts bounds the writes of settle: a race with a takeover costs
// one more.
const settleAttempts = 3

// settle records o as the outcome of key: through t first when it is not
// zero, else (or when t is stale) through the record's current claim. The
// key's execution is unique (its name is the key's), so whichever claim
// of the key is IN_PROGRESS is waiting for this very execution, and its
// outcome is accepted from whichever claim started or attached it.
//
// A success also corrects a FAILED record when it comes from the
// execution (o.arn) the record names or the record names none: Step
// Functions redrives a failed execution under the same ARN. A success
// through a token (no ARN) does not: it may come from a worker of an
// execution that was stopped.
//
// The returned state is the record as last read, nil when not read. Every
// write carries the trace context of work, the token the execution was
// started with (its envelope's), when known: the engine links the write's
// span to the call that began the work.
func (s *Starter) settle(ctx context.Context, key idem.StoreKey, t, work idem.Token, o outcome) (Action, *idem.State, error) {
	var st *idem.State
	for range settleAttempts {
		if !t.IsZero() {
			err := s.write(ctx, t, o)
			switch {
			case err == nil && !o.succeeded:
				return ActionFailed, st, nil
			case err == nil && t.Status == idem.StatusFailed:
				return ActionRedriven, st, nil
			case err == nil:
				return ActionCompleted, st, nil
			case !errors.Is(err, idem.ErrStaleToken):
				return "", st, err
			}
		}
		var err error
		st, err = s.e.Status(ctx, key)
		if errors.Is(err, idem.ErrNotFound) {
			return ActionGone, nil, nil
		}
		if err != nil {
			return "", nil, err
		}
		switch st.Status {
		case idem.StatusCompleted:
			if o.succeeded {
				return ActionDuplicate, st, nil
			}
			return ActionSettled, st, nil
		case idem.StatusFailed:
			if !o.succeeded {
				return ActionDuplicate, st, nil
			}
			if o.arn == "" || (st.Ref != "" && st.Ref != o.arn) {
				return ActionSettled, st, nil
			}
		}
		t = st.Token().WithTraceOf(work)
	}
	return "", st, fmt.Errorf("idemsfn: the record of %s changed under %d writes in a row; try again", key, settleAttempts)
}

// write records o through t.
func (s *Starter) write(ctx context.Context, t idem.Token, o outcome) error {
	if o.succeeded {
		return s.e.Complete(ctx, t, o.output)
	}
	return s.e.Fail(ctx, t, o.err)
}

// Complete records output as the outcome of the execution that token
// (its input's $.idem.token) was issued for: for the workflow's last step,
// an activity worker or a Lambda function, after it has done its work.
// output must be JSON; it is what later calls of the key get back.
//
// The write is fenced. If the token's claim is no longer the record's
// because another claim of the key adopted the same execution (a takeover
// after the expected completion, an orphan repair), the output is recorded
// through that claim: a key has one execution, and its completion is
// accepted whichever claim attached it. A record COMPLETED already is left
// as it is (nil). A FAILED record is not changed (a [*SettledError]): only
// the execution's own success — a "SUCCEEDED" event or the [Reconciler] —
// corrects it, since a worker's success may belong to an execution that
// was stopped. No live record: an error matching idem.ErrNotFound. A token
// of another operation: an idem.ErrInvalidToken.
func (s *Starter) Complete(ctx context.Context, token string, output json.RawMessage) error {
	t, err := idem.ParseToken(token, s.cfg.Operation)
	if err != nil {
		return err
	}
	if !json.Valid(output) {
		return errors.New("idemsfn: Complete needs a JSON output")
	}
	return s.finish(ctx, t, succeeded(output, ""))
}

// Fail records the failure of the execution that token was issued for,
// with the error name and cause Step Functions would report (stored as the
// [*idem.TerminalError]'s Code and Message; an empty errName is stored as
// "States.FAILED"). Call it only where the workflow cannot succeed any
// more — a step with no retry or catch left — or leave failures to the
// "Execution Status Change" events and the [Reconciler]. Fenced and
// adopted as [Starter.Complete] is; a record FAILED already is left as it
// is (nil), a COMPLETED one too (a [*SettledError]).
func (s *Starter) Fail(ctx context.Context, token, errName, cause string) error {
	t, err := idem.ParseToken(token, s.cfg.Operation)
	if err != nil {
		return err
	}
	return s.finish(ctx, t, failed("FAILED", errName, cause, ""))
}

func (s *Starter) finish(ctx context.Context, t idem.Token, o outcome) error {
	a, st, err := s.settle(ctx, t.Key, t, t, o)
	switch {
	case err != nil:
		return err
	case a == ActionSettled:
		return &SettledError{State: st}
	case a == ActionGone:
		return fmt.Errorf("idemsfn: %s: %w", t.Key, idem.ErrNotFound)
	}
	return nil
}
