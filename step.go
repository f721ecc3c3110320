// Steps: the finished parts of an operation, recorded under its claim so
// that a holder taking the key over after a crash resumes after them.

package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Step runs fn as the next step of the operation running in ctx (under
// [Do], [DoIdentity], [DoBatch] or [Op.Do]) and records its outcome under
// the operation's claim, fenced, before it returns: one store round trip
// (store.Stepper). When the key is taken over after its holder crashed,
// the new holder's steps whose outcomes were recorded return them without
// running, and the first unfinished step runs: the operation resumes
// after its last finished step instead of starting over.
//
// Steps are numbered in the order the operation calls them, and matched
// by that number with the steps the claim's record holds:
//
//   - a step recorded at this number under this name: its recorded value
//     is decoded and returned (or its recorded terminal error), and fn
//     does not run;
//   - a step recorded at this number under another name: a
//     an error matching [ErrStepOrder], and fn does not run. The
//     operation's steps must be called in one order, run after run; a
//     takeover never runs a finished step again silently;
//   - no step recorded at this number: fn runs, with ctx. Its value is
//     encoded with the engine's codec and recorded, then returned. A
//     [*TerminalError] (see [Terminal]) is recorded too, and returned: a
//     resumed run gets it again. Any other error is returned and not
//     recorded: the step runs again on a retry, and the next step this
//     run calls must be the same one (a retry inside the operation), or
//     the call fails with [ErrStepOrder].
//
// When fn has run but its outcome cannot be recorded, Step returns fn's
// value with an error: the step runs again after a crash. The error
// matches [ErrLeaseLost] when the claim was taken over (stop: another
// holder runs the operation), is a [*StoreError] (Op observe.StoreStep)
// when the store failed for Config.WriteTimeout, and is a
// [*TerminalError] with [CodeResultTooLarge] when the record's steps
// would pass the size limit (Config.MaxResultBytes, which bounds the
// record's steps taken together, or the store's): returned by the
// operation, it marks the key FAILED, so that no retry runs the step
// again.
//
// A step's outcome lives as long as the claim: once the operation's
// outcome is recorded (COMPLETED or FAILED) the steps are dropped, and a
// replay returns the outcome without reading them. When the operation
// returns an ordinary error (or panics) after a step was recorded, the
// claim is not released, which would delete its steps: its lease is ended
// instead, so that a retry takes the key over at once and resumes.
//
// Steps run one at a time: a Step called while another step of the same
// operation runs (from another goroutine, or from inside fn) fails with
// [ErrStepOrder]. Call Step before the operation returns. name is 1 to
// [MaxStepNameLen] bytes of UTF-8 ([ErrInvalidArgument]). Outside an
// operation Step fails with [ErrNoOperation], over a store without the
// power with [ErrStepsUnsupported]; fn does not run. An operation run
// without a claim (Config.Disabled, or Config.FailOpen after the claim
// failed) runs fn and records nothing.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	h, ok := ctx.Value(holderKey{}).(*holder)
	if !ok {
		if _, disabled := ctx.Value(disabledKey{}).(StoreKey); disabled || ctx.Value(unprotectedKey{}) != nil {
			return fn(ctx) // nothing is claimed: nothing to record
		}
		return zero, fmt.Errorf("%w: Step %q: call it with the context of an operation run by Do, DoIdentity, DoBatch or Op.Do", ErrNoOperation, name)
	}
	if name == "" || len(name) > MaxStepNameLen || !utf8.ValidString(name) {
		return zero, fmt.Errorf("%w: step name %q must be 1 to %d bytes of UTF-8", ErrInvalidArgument, name, MaxStepNameLen)
	}
	e := h.e
	if _, ok := e.store.(store.Stepper); !ok {
		return zero, fmt.Errorf("%w: Step %q over a %T", ErrStepsUnsupported, name, e.store)
	}
	log := &h.steps
	i, rec, err := log.begin(h.key, name)
	if err != nil {
		return zero, err
	}
	if rec != nil {
		// Finished before a takeover: its recorded outcome, fn unrun.
		log.replayed()
		if rec.Err != nil {
			return zero, terminalFromRecord(rec.Err)
		}
		var v T
		if err := decode(e, rec.Result, &v); err != nil {
			return zero, &store.CorruptError{Key: h.key, Reason: fmt.Sprintf("step %q's recorded result does not decode into %T: %v", name, v, err)}
		}
		return v, nil
	}
	if ctx.Err() != nil {
		log.failed(name)
		return zero, context.Cause(ctx)
	}
	v, ferr := fn(ctx)
	st := store.Step{Name: name}
	var term *TerminalError
	switch {
	case ferr == nil:
		if st.Result, err = encodeValue(e, &v); err != nil {
			log.failed(name)
			return v, &encodeError{err}
		}
	case errors.As(ferr, &term):
		er := term.record()
		st.Err = &er
	default:
		log.failed(name)
		return v, ferr
	}
	if limit := e.cfg.MaxResultBytes; limit > 0 && log.size+st.Size() > limit {
		log.failed(name)
		return v, stepTooLarge(name, log.size+st.Size(), limit)
	}
	if err := h.write(ctx, writeReq{kind: writeStep, step: &st, index: i}); err != nil {
		log.failed(name)
		h.writeFailed(observe.StoreStep, err)
		if tl, ok := asTooLarge(err); ok {
			return v, stepTooLarge(name, tl.Size, tl.Limit)
		}
		if store.TakenOver(err) {
			return v, fmt.Errorf("%w: step %q could not be recorded: %w", ErrLeaseLost, name, err)
		}
		return v, &StoreError{Op: observe.StoreStep, Key: h.key, Err: err}
	}
	log.recorded(st)
	return v, ferr
}

// stepTooLarge is the error of a step whose record would be size bytes,
// over limit: terminal, so that an operation that returns it marks its key
// FAILED instead of running the step again.
func stepTooLarge(name string, size, limit int) *TerminalError {
	er := boundedError(CodeResultTooLarge, fmt.Sprintf("step %q: the record's steps would be %d bytes, over the limit of %d", name, size, limit), limit)
	return &TerminalError{Code: er.Code, Message: er.Message}
}

// encodeValue encodes *v as the engine encodes an operation's value: a
// [JSONCodec] engine takes a []byte or json.RawMessage as it
// is.
func encodeValue[T any](e *Engine, v *T) ([]byte, error) {
	if e.raw {
		if b, ok := rawBytes(v); ok {
			return bytes.Clone(b), nil
		}
	}
	return e.cfg.Codec.Marshal(*v)
}

// unprotectedKey marks the context of an operation run without a claim
// after the claim failed (Config.FailOpen): Step runs fn as it is.
type unprotectedKey struct{}

// stepLog is a holder's steps: those its claim's record held when it was
// acquired (a takeover's) and those recorded since, and which one runs.
type stepLog struct {
	mu    sync.Mutex
	steps []store.Step // recorded: the claim's, then this run's
	size  int          // their store.Step.Size, summed
	next  int          // the number of the next step called
	busy  bool         // a step runs
	fail  string       // the step at next that failed unrecorded, if any
}

// reset starts the log of a claim whose record holds steps.
func (l *stepLog) reset(steps []store.Step) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Clipped: this run's steps are appended to a copy, never into the
	// claim's answer, which the flight's followers read.
	l.steps, l.size, l.next, l.busy, l.fail = steps[:len(steps):len(steps)], 0, 0, false, ""
	for _, st := range steps {
		l.size += st.Size()
	}
}

// begin starts step name: its number, and its recorded outcome when it
// has one, or the error that keeps it from running.
func (l *stepLog) begin(key, name string) (int, *store.Step, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := l.next
	switch {
	case l.busy:
		return 0, nil, fmt.Errorf("%w: step %q of %s called while another step runs: an operation's steps run one at a time", ErrStepOrder, name, key)
	case i < len(l.steps) && l.steps[i].Name != name:
		return 0, nil, &stepOrderError{Key: key, Index: i, Want: l.steps[i].Name, Got: name, Recorded: true}
	case l.fail != "" && l.fail != name:
		return 0, nil, &stepOrderError{Key: key, Index: i, Want: l.fail, Got: name}
	}
	l.busy = true
	if i < len(l.steps) {
		return i, &l.steps[i], nil
	}
	return i, nil, nil
}

// replayed ends a step answered from the record.
func (l *stepLog) replayed() {
	l.mu.Lock()
	l.next++
	l.busy = false
	l.mu.Unlock()
}

// recorded ends a step whose outcome st was recorded.
func (l *stepLog) recorded(st store.Step) {
	l.mu.Lock()
	l.steps = append(l.steps, st)
	l.size += st.Size()
	l.next++
	l.busy, l.fail = false, ""
	l.mu.Unlock()
}

// failed ends step name unrecorded: it must be called again next.
func (l *stepLog) failed(name string) {
	l.mu.Lock()
	l.busy, l.fail = false, name
	l.mu.Unlock()
}

// held reports whether the claim's record holds steps.
func (l *stepLog) held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.steps) > 0
}

// giveUp gives the claim up after the operation failed with an ordinary
// error or panicked: released, so that a retry can run; or, when its
// record holds steps, kept with them and its lease ended, so that a retry
// takes the key over at once and resumes after them (a release would
// delete them). The error is the store's last answer when the write
// failed (logged and counted already).
func (h *holder) giveUp(ctx context.Context) error {
	if !h.steps.held() {
		return h.release(ctx)
	}
	err := h.write(ctx, writeReq{kind: writeExtend, extend: func(p *store.ExtendParams) { p.LeaseUntil = p.Now }})
	if err != nil && !store.TakenOver(err) {
		h.writeFailed(observe.StoreExtend, err)
		return err
	}
	h.observe(observe.OutcomeReleased)
	h.e.cfg.Logger.Info("idem: operation failed after finished steps; its lease is ended and its steps kept, so that a retry resumes after them",
		"key", h.key, "fence", h.fence)
	return nil
}
