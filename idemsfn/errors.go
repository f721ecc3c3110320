package idemsfn

import (
	"errors"
	"fmt"

	"github.com/seed-a1b882c0/idem"
)

// Errors of [Starter.Start].
var (
	// ErrStartRefused: Step Functions refused StartExecution for good (an
	// invalid name or input, a state machine that does not exist, access
	// denied): no execution was started, and the claim was released so a
	// corrected call can run. The error is a [*StartError].
	ErrStartRefused = errors.New("idemsfn: StartExecution refused")
	// ErrStartUnknown: StartExecution failed in a way that leaves unknown
	// whether the execution started (a timeout, throttling, a server
	// error). The claim is kept: a later Start after Config.OrphanGrace,
	// or the [Reconciler], starts again under the same name and adopts the
	// execution if there is one. The error is a [*StartError].
	ErrStartUnknown = errors.New("idemsfn: StartExecution outcome unknown")
	// ErrForeignExecution: an execution has the key's name but its input
	// is not the envelope of that key. Nothing was attached. The error is
	// a [*ForeignExecutionError].
	ErrForeignExecution = errors.New("idemsfn: execution of another key")
)

// Errors of completions ([Starter.Complete], [Starter.Fail]) and events
// ([Starter.HandleEvent]).
var (
	// ErrSettled: the key's record already holds the other outcome (a
	// Fail for a COMPLETED record); it was left as it is. The error is a
	// [*SettledError].
	ErrSettled = errors.New("idemsfn: key already settled with another outcome")
	// ErrMalformedEvent: an event is not a Step Functions "Execution
	// Status Change" event or lacks what it must carry. The error is an
	// [*EventError].
	ErrMalformedEvent = errors.New("idemsfn: malformed event")
	// ErrMalformedEnvelope: an execution's input is not an envelope
	// written by [Starter.Start]. The error is an [*EnvelopeError].
	ErrMalformedEnvelope = errors.New("idemsfn: malformed envelope")
)

// StartError is a failed StartExecution.
type StartError struct {
	// Key is the store key and Name the execution name.
	Key, Name string
	// Released is true when the call was refused for good and the claim
	// was released ([ErrStartRefused]); false when the claim was kept
	// ([ErrStartUnknown]).
	Released bool
	// Err is the SDK's error.
	Err error
}

func (e *StartError) Error() string {
	if e.Released {
		return fmt.Sprintf("idemsfn: StartExecution %s for %s refused (claim released): %v", e.Name, e.Key, e.Err)
	}
	return fmt.Sprintf("idemsfn: StartExecution %s for %s failed and may have started (claim kept for adoption): %v", e.Name, e.Key, e.Err)
}

// Unwrap returns the SDK's error.
func (e *StartError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStartRefused) or errors.Is(err,
// ErrStartUnknown) true, as Released says.
func (e *StartError) Is(target error) bool {
	return (target == ErrStartRefused && e.Released) || (target == ErrStartUnknown && !e.Released)
}

// ForeignExecutionError is an execution whose name is the key's but whose
// input names another key, or is no envelope at all.
type ForeignExecutionError struct {
	Key          string
	ExecutionArn string
	// Reason says what the input held.
	Reason string
}

func (e *ForeignExecutionError) Error() string {
	return fmt.Sprintf("idemsfn: execution %s has the name of %s but %s", e.ExecutionArn, e.Key, e.Reason)
}

// Is makes errors.Is(err, ErrForeignExecution) true.
func (e *ForeignExecutionError) Is(target error) bool { return target == ErrForeignExecution }

// SettledError is a completion refused because the record holds the
// other outcome.
type SettledError struct {
	// State is the record as it stands.
	State *idem.State
}

func (e *SettledError) Error() string {
	return fmt.Sprintf("idemsfn: %s is already %s; left as it is", e.State.Key, e.State.Status)
}

// Is makes errors.Is(err, ErrSettled) true.
func (e *SettledError) Is(target error) bool { return target == ErrSettled }

// EventError is an event that cannot be handled.
type EventError struct {
	Reason string
}

func (e *EventError) Error() string { return "idemsfn: malformed event: " + e.Reason }

// Is makes errors.Is(err, ErrMalformedEvent) true.
func (e *EventError) Is(target error) bool { return target == ErrMalformedEvent }

// EnvelopeError is an execution input that is not an envelope.
type EnvelopeError struct {
	Reason string
}

func (e *EnvelopeError) Error() string { return "idemsfn: malformed envelope: " + e.Reason }

// Is makes errors.Is(err, ErrMalformedEnvelope) true.
func (e *EnvelopeError) Is(target error) bool { return target == ErrMalformedEnvelope }
