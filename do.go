// The typed calls: Do, DoIdentity and DoCompleting, and the typed layer
// that encodes an operation's value and decodes a replayed one.

package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"unsafe"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Do runs fn at most once for the key that req names: the usual call,
// for a request and a function. See [DoIdentity] for its rules.
func Do[T any](ctx context.Context, e *Engine, req Request, fn func(context.Context) (T, error)) (Result[T], error) {
	if e.cache != nil && req.Payload == nil && req.Key != "" && !e.cfg.Disabled && e.tracer == nil {
		if res, hit, err := cacheHit[T](e, &req); hit {
			return res, err
		}
	}
	id, err := req.Identity()
	if err != nil {
		return Result[T]{}, err
	}
	return DoIdentity(ctx, e, id, fn)
}

// cacheHit answers a call with an explicit key and no payload from the
// local cache, if it holds the key, without building the call's store key
// (the cache is keyed by its parts). A key the cache holds was valid when
// it was stored, so no check is skipped; the answer is every path's
// (call.fromCache, typedAnswer).
func cacheHit[T any](e *Engine, req *Request) (res Result[T], hit bool, err error) {
	// The key's bytes are read in place: Sum256 neither keeps nor changes them.
	ck := cacheKey{name: req.Operation, tenant: req.Tenant, sum: sha256.Sum256(unsafe.Slice(unsafe.StringData(req.Key), len(req.Key)))}
	ent, ok := e.cache.lookup(ck, store.Millis(e.cfg.Clock.Now()))
	if !ok {
		return res, false, nil
	}
	c := call{e: e, key: ent.key, name: req.Operation} // no payload: no fingerprint
	out, err := c.fromCache(ent)
	res, err = typedAnswer[T](e, ent.key, out, err, false, nil)
	return res, true, err
}

// DoIdentity is [Do] for an [Identity] derived already: what an adapter
// calls, having keyed the call through package clientkey.
//
// DoIdentity runs fn at most once for id.Key (within the expiry window, while
// claims are honoured):
//
//   - the first call claims the key, runs fn with a context carrying the
//     [Claim], renews the lease while fn runs, and records the outcome:
//     success → COMPLETED with the encoded value; a [*TerminalError] →
//     FAILED, returned now and replayed later; any other error or a panic
//     → the claim is released so a retry can run (the panic is re-raised);
//   - a later call with the same key replays: Result.Replayed is true and
//     Value is the stored value, or the error is the stored
//     [*TerminalError];
//   - a call while another holds the key fails with an [*InProgressError],
//     or waits up to Config.Wait; duplicates inside one process share one
//     claim;
//   - a call whose payload fingerprint differs from the stored one fails
//     with a [*MismatchError], on every path;
//   - a store failure fails the call closed with a [*StoreError] and fn does
//     not run (unless Config.FailOpen).
//
// When fn succeeds but its outcome cannot be recorded, the value is still
// returned; the failure is logged and counted (observe.OutcomeCompleteFailed).
func DoIdentity[T any](ctx context.Context, e *Engine, id Identity, fn func(context.Context) (T, error)) (Result[T], error) {
	return doTyped(ctx, e, id, runFunc[T](fn), nil)
}

// runner is an operation as the engine runs it.
type runner[T any] interface {
	Run(ctx context.Context) (T, error)
}

// runFunc is a func as a runner.
type runFunc[T any] func(context.Context) (T, error)

func (f runFunc[T]) Run(ctx context.Context) (T, error) { return f(ctx) }

// DoCompleting is [Do] for an operation that commits its own writes and its
// outcome in one transaction: pick it when the two must commit together.
//
// DoCompleting is [Do] for an operation that records its own success, in
// the same transaction as its own writes (idempg.DoTx is built on it):
// the business write and the COMPLETED record then commit together or not
// at all. fn calls c.Params(v) to get the Complete for this call's claim
// (the value encoded once, with the engine's codec), makes it in its
// transaction, and returns v with a nil error only once that transaction
// committed. The engine then writes nothing more: no second encode, no
// Complete. If fn returns an error the transaction must have rolled back;
// the error is handled as by Do (stored if terminal, else the key is
// released). A nil error without a call to Params is recorded as by Do.
//
// A value whose encoding is over Config.MaxResultBytes is refused by
// Params with a [*TerminalError] of code [CodeResultTooLarge]: fn returns
// it without committing, the key is marked FAILED with it, and this call
// and every retry get it ([ErrResultTooLarge]), as retries of Do do.
//
// When the engine runs fn without a claim (Config.Disabled, or
// Config.FailOpen after the claim failed), c.Unprotected reports it: fn
// makes its writes without the record, and does not call Params.
func DoCompleting[T any](ctx context.Context, e *Engine, req Request, fn func(ctx context.Context, c *Completion[T]) (T, error)) (Result[T], error) {
	id, err := req.Identity()
	if err != nil {
		return Result[T]{}, err
	}
	return doTyped(ctx, e, id, nil, fn)
}

// Completion hands an operation run by [DoCompleting] the Complete of its
// own claim.
type Completion[T any] struct {
	e           *Engine
	claim       Claim
	result      []byte
	unprotected bool // run without a claim: nothing to complete
}

// Unprotected reports whether the operation runs without a claim
// (Config.Disabled, or Config.FailOpen after the claim failed): there is
// no record to complete, so the operation makes its writes alone.
func (c *Completion[T]) Unprotected() bool { return c.unprotected }

// Params encodes v with the engine's codec and returns the parameters of
// the Complete that records it under this call's claim. The operation makes
// that Complete itself, inside its own transaction. An encoding over
// Config.MaxResultBytes is refused with a [*TerminalError] of code
// [CodeResultTooLarge] (see [DoCompleting]); so is none at all when the
// operation runs without a claim ([Completion.Unprotected]), with
// [ErrInvalidArgument].
func (c *Completion[T]) Params(v T) (store.CompleteParams, error) {
	if c.unprotected {
		return store.CompleteParams{}, fmt.Errorf("%w: Completion.Params: the operation runs without a claim (Completion.Unprotected)", ErrInvalidArgument)
	}
	b, err := c.e.cfg.Codec.Marshal(v)
	if err != nil {
		return store.CompleteParams{}, &encodeError{err}
	}
	if limit := c.e.cfg.MaxResultBytes; limit > 0 && len(b) > limit {
		er := resultTooLarge(len(b), limit)
		return store.CompleteParams{}, &TerminalError{Code: er.Code, Message: er.Message}
	}
	c.result = b
	now := store.Millis(c.e.cfg.Clock.Now())
	return store.CompleteParams{ClaimRef: c.claim.ref(now),
		ExpiresAt: now + c.e.cfg.Expiry.Milliseconds(), Result: b}, nil
}

// doTyped is the typed layer of every call: it runs fn, or completing, an
// operation that may record its own success (DoCompleting), so that a
// plain Do pays nothing for it.
func doTyped[T any](ctx context.Context, e *Engine, id Identity, fn runner[T], completing func(context.Context, *Completion[T]) (T, error)) (Result[T], error) {
	if e.cfg.Disabled {
		e.cfg.Observer.Observe(id.StoreKey.Operation, observe.OutcomeUnprotected)
		var sp observe.Span
		if e.tracer != nil {
			c := call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation}
			ctx = c.startSpan(ctx, observe.CallDo, observe.TraceContext{})
			sp = c.span
			sp.Outcome(observe.OutcomeUnprotected)
		}
		v, err := callOp(context.WithValue(ctx, disabledKey{}, id.StoreKey), fn, completing, &Completion[T]{e: e, unprotected: true})
		if sp != nil {
			sp.End(observe.CallEnd{Err: err})
		}
		return Result[T]{Value: v, StoreKey: id.StoreKey.String()}, err
	}
	// One allocation holds the whole call: its claim, its in-process
	// flight, its contexts and the typed value.
	t := &typedCall[T]{fn: fn, completing: completing, keep: e.cache != nil && cacheable[T]()}
	t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.storedForm(), hold: id.HoldCrashed, op: t}
	if e.tracer != nil {
		ctx = t.startSpan(ctx, observe.CallDo, observe.TraceContext{})
		defer t.endSpan(observe.CallEnd{Panicked: true}) // only when result did not end it: a panic
	}
	out, err := t.run(ctx, nil)
	return t.result(ctx, out, err)
}

// result is the typed answer of a call that ran (out, err); it ends the
// call's span, when it is traced.
func (t *typedCall[T]) result(ctx context.Context, out outcome, err error) (Result[T], error) {
	res, err := t.answer(ctx, out, err)
	if t.span != nil {
		t.endSpan(observe.CallEnd{Replayed: res.Replayed, Fence: res.Fence, Err: err})
	}
	return res, err
}

// answer is the typed answer of a call that ran (out, err).
func (t *typedCall[T]) answer(ctx context.Context, out outcome, err error) (Result[T], error) {
	e, fn, completing := t.e, t.fn, t.completing
	res := Result[T]{StoreKey: t.key}
	if err != nil && !t.ran && e.cfg.FailOpen && isClaimFailure(err) {
		t.observe(observe.OutcomeUnprotected)
		e.cfg.Logger.Warn("idem: store failed; running the operation UNPROTECTED because FailOpen is set",
			"key", t.key, "err", err)
		v, ferr := callOp(context.WithValue(ctx, unprotectedKey{}, true), fn, completing, &Completion[T]{e: e, unprotected: true})
		res.Value = v
		return res, ferr
	}
	return typedAnswer(e, t.key, out, err, t.ran, &t.value)
}

// typedAnswer is the typed answer of a call with store key key from out and
// err. When ran, *v is the operation's value; else the value comes from
// out: the cache's, or a stored result, decoded into v (nil: a new T).
func typedAnswer[T any](e *Engine, key string, out outcome, err error, ran bool, v *T) (Result[T], error) {
	res := Result[T]{StoreKey: key, Replayed: out.replayed, Fence: out.fence, Recorded: out.recorded, Unrecorded: out.unrecorded}
	switch {
	case ran:
		res.Value = *v
	case out.value != nil:
		res.Value, _ = out.value.(T)
	case out.result != nil:
		if v == nil {
			v = new(T) // on the heap only for a stored result to decode
		}
		if uerr := decode(e, out.result, v); uerr != nil {
			return res, &store.CorruptError{Key: key, Reason: fmt.Sprintf("stored result does not decode into %T: %v", *v, uerr)}
		}
		res.Value = *v
	}
	return res, err
}

// callOp calls fn, or completing with c.
func callOp[T any](ctx context.Context, fn runner[T], completing func(context.Context, *Completion[T]) (T, error), c *Completion[T]) (T, error) {
	if fn != nil {
		return fn.Run(ctx)
	}
	return completing(ctx, c)
}

// typedCall is a call of an operation returning T.
type typedCall[T any] struct {
	holder
	fn         runner[T]
	completing func(context.Context, *Completion[T]) (T, error) // may record its own success (DoCompleting)
	keep       bool                                             // the local cache may keep the value itself (see cacheable)
	ran        bool                                             // fn was called
	value      T                                                // fn's value, or the replayed one
}

// runOp runs the operation and encodes its value.
func (t *typedCall[T]) runOp(ctx context.Context) (opResult, error) {
	var comp *Completion[T]
	if t.completing != nil {
		comp = &Completion[T]{e: t.e, claim: Claim{Key: t.key, Fence: t.fence, Owner: t.owner}}
	}
	v, err := callOp(ctx, t.fn, t.completing, comp)
	t.value, t.ran = v, true
	if err != nil {
		return opResult{}, err
	}
	var out opResult
	if comp != nil && comp.result != nil {
		out.result, out.selfRecorded = comp.result, true
	} else if out.result, err = t.encode(); err != nil {
		return opResult{}, &encodeError{err}
	}
	if t.keep {
		out.value = v
	}
	return out, nil
}

// encode encodes t.value with the engine's codec; a [JSONCodec] engine takes a []byte or json.RawMessage value as it is,
// without reflection.
func (t *typedCall[T]) encode() ([]byte, error) {
	if t.e.raw {
		if b, ok := rawBytes(&t.value); ok {
			return bytes.Clone(b), nil // the caller keeps its own slice
		}
	}
	return t.e.cfg.Codec.Marshal(t.value)
}

// decode decodes a stored result into v, as encode's inverse.
func decode[T any](e *Engine, b []byte, v *T) error {
	if e.raw && setRawBytes(v, b) {
		return nil
	}
	return e.cfg.Codec.Unmarshal(b, v)
}

// opResult is what the operation hands back to the engine.
type opResult struct {
	result       []byte // the encoded value
	value        any    // the value itself, when the local cache may keep it (see cacheable)
	selfRecorded bool   // the operation recorded its own success ([DoCompleting])
}

// operation runs the operation of a call.
type operation interface {
	runOp(ctx context.Context) (opResult, error)
}

type encodeError struct{ err error }

func (e *encodeError) Error() string { return "idem: result cannot be encoded: " + e.err.Error() }
func (e *encodeError) Unwrap() error { return e.err }

func isClaimFailure(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Op == observe.StoreClaim
}
