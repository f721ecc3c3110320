// Errors: the engine's sentinel and typed errors, grouped by operation.

package idem

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Errors of a call through the engine ([Do], [Op.Do]).
var (
	// ErrInProgress: another caller holds the key and the call did not wait
	// (or waited its limit). The error is an [*InProgressError].
	ErrInProgress = errors.New("idem: operation already in progress")
	// ErrMismatch: the key was used before with a different payload. The
	// error is a [*MismatchError].
	ErrMismatch = errors.New("idem: idempotency key reused with a different payload")
	// ErrTerminal: the operation failed with a terminal error, stored and
	// replayed. The error is a [*TerminalError].
	ErrTerminal = errors.New("idem: terminal error")
	// ErrResultTooLarge: the first execution succeeded but its result was
	// over the size limit, so it could not be stored; later calls get this
	// stored error instead of running the operation again.
	ErrResultTooLarge = errors.New("idem: stored result was too large to replay")
	// ErrLeaseLost: the lease could not be renewed because another caller
	// took the key over. The operation's context is cancelled with a cause
	// that matches it and wraps the store's refusal (a *store.FencedError
	// or store.ErrNotFound).
	ErrLeaseLost = errors.New("idem: lease lost to another caller")
	// ErrStore: the store failed; the call failed closed and the operation
	// did not run. The error is a [*StoreError].
	ErrStore = errors.New("idem: store error")
	// ErrHeld: the key's holder is gone (its lease passed with no outcome)
	// and the key's takeover policy is Hold (Config.HoldCrashed): it is
	// not run again but waits for a person to settle it. Not in progress:
	// retrying does not help until then. The error is a [*HeldError].
	ErrHeld = errors.New("idem: key held for an operator")
	// ErrUncertain: the operation could not tell whether its effect took
	// place (see [Uncertain]); the claim was kept until its lease ends.
	ErrUncertain = errors.New("idem: outcome uncertain")
	// ErrStepOrder: a step was called where the claim's record holds
	// another one (the operation's steps ran in another order before a
	// takeover), or where a step that failed must be called again first,
	// or while another step of the operation runs. The step did not run.
	// A mismatch with a recorded step is a [*stepOrderError].
	ErrStepOrder = errors.New("idem: step called out of order")
	// ErrNoOperation: Step was called with a context that carries no
	// operation run by the engine (Do, DoIdentity, DoBatch, Op.Do). The
	// step did not run.
	ErrNoOperation = errors.New("idem: no operation in the context")
	// ErrStepsUnsupported: the engine's store cannot record steps (it
	// does not implement store.Stepper). The step did not run.
	ErrStepsUnsupported = errors.New("idem: the store does not record steps (store.Stepper)")
)

// Errors of input validation.
var (
	// ErrInvalidKey: a scope, tenant, key or store key is malformed, or
	// an idempotency key as a transport received it (an Idempotency-Key
	// header, gRPC metadata). The error is a [*KeyError], wherever the key
	// was validated.
	ErrInvalidKey = errors.New("idem: invalid key")
	// ErrInvalidPayload: a JSON payload could not be canonicalised. The
	// error is a [*PayloadError].
	ErrInvalidPayload = errors.New("idem: invalid payload")
	// ErrInvalidConfig: a [Config] field is out of range. It is
	// store.ErrInvalidConfig, the same error value, which stores return.
	ErrInvalidConfig = store.ErrInvalidConfig
	// ErrInvalidArgument: an argument of a call is out of range — a
	// duration of [Engine.Begin], [Engine.Extend] or [Detach], an
	// execution reference — while the engine's configuration is fine.
	ErrInvalidArgument = errors.New("idem: invalid argument")
)

// stepOrderError is returned by [Step] when the step called at Index is
// not the one that stands there: Want, recorded by an earlier holder of
// the claim (Recorded), or a step of this run that failed and was not
// recorded, which must be called again before any other.
type stepOrderError struct {
	Key   string
	Index int
	// Want is the step that stands at Index; Got is the one called.
	Want, Got string
	// Recorded is true when Want was recorded by an earlier holder,
	// false when it failed in this run.
	Recorded bool
}

func (e *stepOrderError) Error() string {
	if e.Recorded {
		return fmt.Sprintf("idem: step %d of %s is %q (recorded before a takeover), but the operation called %q: steps must be called in one order", e.Index, e.Key, e.Want, e.Got)
	}
	return fmt.Sprintf("idem: step %d of %s, %q, failed and was not recorded, but the operation called %q next: call the failed step again, or return its error", e.Index, e.Key, e.Want, e.Got)
}

// Is makes errors.Is(err, ErrStepOrder) true.
func (e *stepOrderError) Is(target error) bool { return target == ErrStepOrder }

// InProgressError is returned when another caller holds the key.
type InProgressError struct {
	Key string
	// LeaseUntil is when the holder's lease ends: the earliest time a retry
	// could take the key over. The holder renews it while it runs, so it
	// says when a holder that is gone loses the key, not when the work
	// ends: see [InProgressError.RetryAfter].
	LeaseUntil time.Time
	// Since is when the holder claimed the key (the record's created_at);
	// zero when unknown.
	Since time.Time
	// Owner is the holder, for logs.
	Owner string
	// Ref is the execution reference attached to the claim, when the work
	// was handed to something else ([Engine.Attach], [Detach]); empty for
	// an operation running in its caller.
	Ref string
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: key %s already in progress (held by %s until %s)",
		e.Key, e.Owner, e.LeaseUntil.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// minRetryAfter is the shortest delay [InProgressError.RetryAfter] gives:
// 100ms.
const minRetryAfter = 100 * time.Millisecond

// RetryAfter returns how long after now a retry makes sense. For an
// operation running in its holder it is as long again as the operation has
// run so far (now - Since), at least 100ms and at most until the
// lease ends: with nothing else known of the operation's duration, the work
// is as likely done by then as not, and a caller that comes back after each
// delay it is told gets the outcome at most one delay after it was stored,
// in a number of tries that grows with the logarithm of the duration. The
// lease's end alone is no estimate: the holder renews the lease while it
// runs (a caller's deadline sets only the first one), so its end says when
// a holder that is gone loses the key, and a retry may take over then. For
// work handed off ([Detach], Ref set), and when Since is unknown, it is the
// time to the lease's end (for handed-off work, the expected completion its
// holder gave), at least 100ms.
func (e *InProgressError) RetryAfter(now time.Time) time.Duration {
	left := e.LeaseUntil.Sub(now)
	d := left
	if e.Ref == "" && !e.Since.IsZero() {
		d = min(now.Sub(e.Since), left)
	}
	return max(d, minRetryAfter)
}

// HeldError is returned when a key waits for a person: claimed under the
// takeover policy Hold, its holder's lease passed with no outcome. The
// record stays IN_PROGRESS (listed as stuck, marked held) until an
// operator resolves it (completed or failed) or releases it to run
// again, or it expires.
type HeldError struct {
	Key string
	// Owner is the lost holder; Since when it claimed the key (zero when
	// unknown); LeaseUntil when its lease passed.
	Owner             string
	Since, LeaseUntil time.Time
	// Ref is the execution reference attached to the claim, if any.
	Ref string
}

func heldError(key string, rec *store.Record) *HeldError {
	he := &HeldError{Key: key, Owner: rec.Owner, LeaseUntil: store.FromMillis(rec.LeaseUntil), Ref: rec.Ref}
	if rec.CreatedAt > 0 {
		he.Since = store.FromMillis(rec.CreatedAt)
	}
	return he
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("idem: key %s is held for an operator: its holder %s left it unfinished (lease passed %s); resolve or release it",
		e.Key, e.Owner, e.LeaseUntil.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// MismatchError is returned when a key is reused with a different payload.
type MismatchError struct {
	Key string
	// Stored and Got are the two payload fingerprints as stored: the
	// version of the fingerprint rules that made them, ':' and the hex
	// digest ("v1:3f2a…"), or empty for a call without a payload.
	Stored, Got string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("idem: key %s was first used with payload %s, now with %s",
		e.Key, short(e.Stored), short(e.Got))
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

func short(fp string) string {
	if fp == "" {
		return "(none)"
	}
	if _, d, ok := splitFingerprint(fp); ok && len(d) > 12 {
		return fp[:len(fp)-len(d)+12] // the version and 12 digits
	}
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// TerminalError is an operation error that is final for its key: the engine
// stores it (status FAILED) and replays it to every later call with the same
// key instead of running the operation again. Mark an error terminal with
// [Terminal] or by returning a *TerminalError.
type TerminalError struct {
	// Code is a short machine-readable code.
	Code string
	// Message is the human-readable message.
	Message string
	// Body is optional encoded detail, stored and replayed as is.
	Body []byte
	// Replayed is true when the error was read from the store rather than
	// returned by the operation in this call.
	Replayed bool
	err      error
}

// Terminal marks err as terminal with a machine-readable code. A nil err
// returns nil.
func Terminal(err error, code string) error {
	if err == nil {
		return nil
	}
	return &TerminalError{Code: code, Message: err.Error(), err: err}
}

func (e *TerminalError) Error() string {
	if e.Code == "" {
		return "idem: terminal error: " + e.Message
	}
	return "idem: terminal error " + strconv.Quote(e.Code) + ": " + e.Message
}

// Unwrap returns the operation's own error on the first execution, nil on
// a replay.
func (e *TerminalError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrTerminal) true, and errors.Is(err,
// ErrResultTooLarge) true for the stored too-large marker.
func (e *TerminalError) Is(target error) bool {
	return target == ErrTerminal || (target == ErrResultTooLarge && e.Code == CodeResultTooLarge)
}

// CodeResultTooLarge is the code of the terminal error the engine stores
// when a successful result is over the size limit.
const CodeResultTooLarge = "idem.result_too_large"

// record is the error as stored. Code and Message are text in every store
// (a PostgreSQL text column, a DynamoDB string), which refuses bytes that
// are not UTF-8 (store.FailParams.Check): an error that wraps a binary
// reply is stored with each such byte as U+FFFD rather than not at all.
func (e *TerminalError) record() store.ErrorRecord {
	return store.ErrorRecord{Code: validText(e.Code), Message: validText(e.Message), Body: e.Body}
}

// validText is s with every byte that is not UTF-8 replaced by U+FFFD.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func terminalFromRecord(r *store.ErrorRecord) *TerminalError {
	if r == nil {
		return &TerminalError{Message: "(no error stored)", Replayed: true}
	}
	return &TerminalError{Code: r.Code, Message: r.Message, Body: r.Body, Replayed: true}
}

// StoreError wraps a store failure seen by the engine.
type StoreError struct {
	// Op is the store operation.
	Op  observe.StoreOp
	Key string
	Err error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("idem: store %s of %s failed: %v", e.Op, e.Key, e.Err)
}

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStore) true.
func (e *StoreError) Is(target error) bool { return target == ErrStore }

// KeyError says why an idempotency key, or a part of its scope, is
// invalid: what was wrong, the value as received, and why. It is the one
// error of key validation: the engine returns it, and so do
// clientkey.ParseHeader, idemhttp.ParseHeader and idemrpc.ParseKey, which
// read a key as a transport received it. Each transport maps it to its own
// answer (idemhttp: 400 with a problem+json body; idemrpc:
// INVALID_ARGUMENT).
type KeyError struct {
	// Field names what was wrong: "operation", "tenant", "key", "store
	// key", or where a transport read the key: "Idempotency-Key header"
	// (clientkey, idemhttp), "idempotency key" (idemrpc).
	Field string
	// Value is the value as received (all of them, joined, when a key was
	// sent more than once).
	Value  string
	Reason string
}

func (e *KeyError) Error() string {
	v := e.Value
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return fmt.Sprintf("idem: invalid %s %q: %s", e.Field, v, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidKey) true.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

// PayloadError describes why a JSON payload could not be canonicalised.
type PayloadError struct {
	// Offset is the byte offset where the problem was found.
	Offset int
	Reason string
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("idem: invalid JSON payload at byte %d: %s", e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidPayload) true.
func (e *PayloadError) Is(target error) bool { return target == ErrInvalidPayload }

// uncertainError marks an operation error whose effect is unknown: a request
// was sent downstream and no answer came back, so the downstream may have
// acted. The engine neither records nor releases the claim: it stops renewing
// the lease and leaves the record IN_PROGRESS, so that no retry runs the
// operation again before the lease ends. After the lease a retry takes the
// key over, as after a crash. Make one with [Uncertain].
type uncertainError struct {
	Err error
}

// Uncertain marks err as an uncertain outcome: a request was sent
// downstream and no answer came back, so the downstream may have acted.
// The engine neither records nor releases the claim: it stops renewing the
// lease and leaves the record IN_PROGRESS, so that no retry runs the
// operation again before the lease ends; after the lease a retry takes the
// key over, as after a crash. The error matches [ErrUncertain] and
// unwraps to err. A nil err returns nil.
func Uncertain(err error) error {
	if err == nil {
		return nil
	}
	return &uncertainError{Err: err}
}

func (e *uncertainError) Error() string { return "idem: outcome uncertain: " + e.Err.Error() }

// Unwrap returns the operation's error.
func (e *uncertainError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUncertain) true.
func (e *uncertainError) Is(target error) bool { return target == ErrUncertain }

// leaseLostError is the cause of an operation's context cancelled because
// its lease was lost: [ErrLeaseLost], wrapping the store's refusal.
type leaseLostError struct{ err error }

func (e *leaseLostError) Error() string        { return ErrLeaseLost.Error() + ": " + e.err.Error() }
func (e *leaseLostError) Is(target error) bool { return target == ErrLeaseLost }
func (e *leaseLostError) Unwrap() error        { return e.err }
