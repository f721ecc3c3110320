// Package consume decides what a message consumer does with a message once
// the engine has answered for it: one verdict, computed here, that
// idemnats (JetStream), idemamqp (RabbitMQ), idemkafka (Kafka, by the
// offsets it commits) and idemlambda's SQS, EventBridge, Kinesis and
// DynamoDB Streams adapters each carry out with their broker's own calls.
// A consumer of another broker should use it too.
//
// # The verdicts
//
//	engine's answer                                        verdict
//	success recorded (COMPLETED), or replayed               Done
//	success whose outcome write failed past WriteTimeout    Done (see below)
//	success, no claim held (engine disabled, fail-open)     Done
//	terminal error recorded or replayed                     DeadLetter
//	success whose result could not be stored (too large)    DeadLetter
//	key reused with another payload                         DeadLetter
//	no usable key (NoKey's error, or idem.ErrInvalidKey)    DeadLetter
//	key held by another consumer                            RetryAfter (its lease)
//	key held for an operator (policy Hold, holder lost)     DeadLetter
//	retryable error (claim released), store failed at claim Retry
//	outcome uncertain (idem.Uncertain)                      Leave
//	outcome write refused: the key was taken over           Leave
//	claim lost while waiting its turn in a batch (not run)  Leave
//
// Done acknowledges (JetStream Ack, AMQP Ack, SQS: not reported). DeadLetter
// stops redelivery (Term, Reject without requeue, a batch item failure that
// the queue's redrive policy moves aside). RetryAfter and Retry ask for the
// message again, later or now. Leave settles nothing the broker can act on:
// JetStream and SQS redeliver after AckWait or the visibility timeout;
// RabbitMQ, where an unsettled delivery holds its prefetch slot until the
// channel closes, tries it later as for Retry.
//
// A key held for an operator ([idem.ErrHeld]: its operation's takeover
// policy is Hold and a consumer died holding it) is dead-lettered, not
// retried: it waits for a person, who may take hours, and a redelivery
// every lease would spend the queue's delivery count (MaxDeliver,
// maxReceiveCount) to reach the dead-letter queue anyway, or, without one,
// loop for as long as the key is held. Once the operator has settled the
// key, the message moved aside is redriven: a key resolved as completed or
// failed replays its outcome (Done or DeadLetter), a released key runs.
//
// # Batches
//
// A consumer that collects messages into batches for idem.DoBatch
// (idemnats.ConsumeBatch, idemamqp's Consumer.RunBatch) takes the shape of
// its batches from [Batching], whose zero fields mean the defaults:
// batches of up to [DefaultBatchSize] messages, what arrived within
// [DefaultBatchWait] of the first, [DefaultBatches] of them at once; and
// forms them with [Collect], which takes what the broker has delivered
// already before it waits for more.
//
// # An outcome write that did not land
//
// The operation ran and returned; then the write of its outcome failed.
// Two cases, told apart by [idem.Result.Unrecorded]:
//
//   - Refused: the key was taken over while the handler ran (it outlived
//     its lease), so another consumer holds it now and will settle it. Leave:
//     acknowledging would settle a delivery the new holder may still be
//     working on, and a redelivery replays the new holder's outcome or waits
//     for it.
//   - Failed: the store was unreachable for all of WriteTimeout. The record
//     stays IN_PROGRESS until its lease ends. Done: a redelivery would wait
//     out the lease and then take the key over and run the operation a
//     second time, since the store never learnt that it ran; acknowledging
//     keeps it at most once and leaves a stuck record (IN_PROGRESS past its
//     lease) that the monitor's idem_stuck and `idemctl list --stuck` show
//     an operator, who resolves it. This is the engine's rule for HTTP (a
//     failed Complete never hides the result from the caller) carried to
//     messages; the message is not lost, its effect happened. A copy of the
//     message published again by a producer after the lease would run again,
//     as after any crash. idemkafka, which settles by committing a
//     partition's offset past every record before it, commits only what is
//     recorded: it carries this Done out as Retry, and the message runs
//     again after the lease (its package doc says why).
package consume

import (
	"errors"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Action is what a consumer does with a message.
type Action int

// The actions, in the order of the package doc's table.
const (
	// Done: acknowledge; the outcome is recorded (or replayed).
	Done Action = iota + 1
	// DeadLetter: stop redelivering the message; it will never succeed
	// as it stands (a key held for an operator: not before a person
	// settles it).
	DeadLetter
	// RetryAfter: another consumer holds the key; deliver the message again
	// after Verdict.Delay.
	RetryAfter
	// Retry: deliver the message again; nothing of this delivery is kept.
	Retry
	// Leave: settle nothing; the broker's own timeout redelivers it.
	Leave
)

var actionNames = [...]string{"", "done", "dead-letter", "retry-after", "retry", "leave"}

func (a Action) String() string {
	if a <= 0 || int(a) >= len(actionNames) {
		return "unknown"
	}
	return actionNames[a]
}

// Verdict is a message's fate.
type Verdict struct {
	Action Action
	// Delay is how long to wait before the message comes again, for
	// RetryAfter.
	Delay time.Duration
	// Err says why, for every action but a plain Done: the handler's or
	// the engine's error, or what kept the outcome from being recorded.
	Err error
}

// ErrOutcomeNotRecorded is in the Err of a Leave or Done whose outcome
// write did not land (see the package doc), with the store's answer; a
// refused write's Err also holds idem.ErrLeaseLost.
var ErrOutcomeNotRecorded = errors.New("consume: the outcome was not recorded")

// ErrNoKey is in the Err of the DeadLetter of a message that has no usable
// key: [NoKey] marks the error that says why.
var ErrNoKey = errors.New("consume: the message has no usable key")

// NoKey marks err, why a message's key (or the identity derived from it)
// could not be had — no key in the message, the key function or
// expression failed — as the engine's answer "no usable key", which
// [Decide] settles as DeadLetter: a consumer hands it to Decide in place
// of an engine's error, for a message it could not give the engine, so
// that this verdict too is Decide's. The mark keeps err's text and its
// chain; errors.Is(NoKey(err), ErrNoKey) is true. NoKey(nil) is nil.
func NoKey(err error) error {
	if err == nil {
		return nil
	}
	return &noKeyError{err}
}

type noKeyError struct{ err error }

func (e *noKeyError) Error() string        { return e.err.Error() }
func (e *noKeyError) Unwrap() error        { return e.err }
func (e *noKeyError) Is(target error) bool { return target == ErrNoKey }

// Decide maps the engine's answer for one message — the Result and error
// of idem.Do, DoIdentity or one item of DoBatch — to its verdict. now is
// the engine's clock, for the delay of a key held elsewhere.
func Decide[T any](res idem.Result[T], err error, now time.Time) Verdict {
	var (
		term   *idem.TerminalError
		inProg *idem.InProgressError
	)
	switch {
	case errors.As(err, &inProg):
		// At the holder's lease end (renewed while it runs), not at
		// inProg.RetryAfter's pace for callers: a queue counts its
		// redeliveries (MaxDeliver, maxReceiveCount), so a message held
		// off comes back as seldom as a lease.
		return Verdict{Action: RetryAfter, Delay: max(inProg.LeaseUntil.Sub(now), time.Second), Err: err}
	case errors.Is(err, idem.ErrUncertain), errors.Is(err, idem.ErrLeaseLost):
		// Uncertain: no retry before the lease ends. Lease lost: an item
		// of a batch whose claim was taken over while it waited did not
		// run; the new holder settles the key.
		return Verdict{Action: Leave, Err: err}
	case errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrInvalidKey), errors.Is(err, ErrNoKey), errors.Is(err, idem.ErrHeld):
		return Verdict{Action: DeadLetter, Err: err}
	}
	if store.TakenOver(res.Unrecorded) {
		// Taken over while the handler ran: the new holder settles it.
		return Verdict{Action: Leave, Err: errors.Join(ErrOutcomeNotRecorded, idem.ErrLeaseLost, res.Unrecorded, err)}
	}
	switch {
	case errors.As(err, &term):
		return Verdict{Action: DeadLetter, Err: err}
	case err != nil:
		return Verdict{Action: Retry, Err: err}
	case res.Recorded == idem.StatusFailed:
		// A success whose result could not be stored: the engine recorded
		// a terminal marker instead, which every redelivery would meet.
		return Verdict{Action: DeadLetter, Err: idem.ErrResultTooLarge}
	case res.Unrecorded != nil:
		// The store failed for all of WriteTimeout after the operation ran.
		return Verdict{Action: Done, Err: errors.Join(ErrOutcomeNotRecorded, res.Unrecorded)}
	}
	return Verdict{Action: Done}
}

// The batch defaults of every consumer that collects messages into
// batches (see [Batching]).
const (
	// DefaultBatchSize is the most messages in one batch.
	DefaultBatchSize = 16
	// DefaultBatchWait is how long, after a batch's first message, a
	// consumer waits for further ones before it runs the batch it has.
	DefaultBatchWait = 2 * time.Millisecond
	// DefaultBatches is how many batches run at once.
	DefaultBatches = 2
)

// Batching is the shape of a consumer's batches.
type Batching struct {
	// Size is the most messages in one batch. Default [DefaultBatchSize].
	Size int
	// Wait is how long, after a batch's first message, the consumer waits
	// for further ones. Default [DefaultBatchWait].
	Wait time.Duration
	// Batches is how many batches run at once. Default [DefaultBatches].
	Batches int
}

// WithDefaults returns b with each zero field set to its default. It
// leaves a negative field as it is, for the consumer to refuse.
func (b Batching) WithDefaults() Batching {
	if b.Size == 0 {
		b.Size = DefaultBatchSize
	}
	if b.Wait == 0 {
		b.Wait = DefaultBatchWait
	}
	if b.Batches == 0 {
		b.Batches = DefaultBatches
	}
	return b
}
