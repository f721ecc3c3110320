// Work that outlives its call: Begin claims a key without running anything
// and returns a token; writes through a token (Complete, Fail, Release,
// Extend, Attach) settle it from any process.

package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Status is the state of a key: [StatusInProgress], [StatusCompleted] or
// [StatusFailed].
type Status = store.Status

// The states of a key.
const (
	StatusInProgress = store.StatusInProgress
	StatusCompleted  = store.StatusCompleted
	StatusFailed     = store.StatusFailed
)

// State is a key's record as callers and operators read it: its status,
// who claimed it and when, the execution it was handed to, when it should
// be done and when it was, and its outcome.
type State struct {
	// Key is the store key.
	Key string
	// Status is the record's status.
	Status Status
	// Fence and Owner name the claim that made (or holds) the record.
	// Owner is the claim's owner: the engine's owner, a unique suffix,
	// and the label given with [WithOwnerLabel], if any.
	Fence uint64
	Owner string
	// Ref is the execution reference attached to the claim ([Engine.Attach]),
	// empty when none was.
	Ref string
	// Fingerprint is the request payload's fingerprint as stored: the
	// version of the fingerprint rules that made it, ':' and the hex
	// SHA-256 ("v1:3f2a…"); empty when no payload was given.
	Fingerprint string
	// CreatedAt is when the claim was made.
	CreatedAt time.Time
	// LeaseUntil is when the claim's lease ends: when the work should be
	// done ([BeginOptions.ExpectedCompletion] after the claim, or as
	// extended), and when another caller may take over an IN_PROGRESS
	// record. [InProgressError.LeaseUntil] is the same time.
	LeaseUntil time.Time
	// CompletedAt is when the record was settled; zero while IN_PROGRESS.
	CompletedAt time.Time
	// ExpiresAt is when the record stops counting.
	ExpiresAt time.Time
	// Result is the encoded result of a COMPLETED record; decode it with
	// [State.Decode].
	Result []byte
	// Err is the stored terminal error of a FAILED record.
	Err *TerminalError
	// Hold says the claim was made under the takeover policy Hold
	// (Config.HoldCrashed): IN_PROGRESS past LeaseUntil, the key waits
	// for a person (or a reconciler holding State.Token) to settle it.
	Hold bool
	// Steps are the finished steps of the operation running under the
	// claim ([Step], store.Stepper), in the order they ran: each one's
	// name, when it was recorded, and its encoded result or terminal
	// error. Only an IN_PROGRESS record holds them (they are dropped when
	// it is settled), and only over a store that records steps.
	Steps []store.Step

	codec  Codec
	engine *Engine // signs Token with its Config.TokenKey
}

func (e *Engine) state(r *store.Record) *State {
	s := &State{
		Key: r.Key, Status: r.Status, Fence: r.Fence, Owner: r.Owner, Ref: r.Ref, Fingerprint: r.Fingerprint,
		CreatedAt: store.FromMillis(r.CreatedAt), LeaseUntil: store.FromMillis(r.LeaseUntil),
		ExpiresAt: store.FromMillis(r.ExpiresAt), Result: r.Result, Hold: r.Hold, Steps: r.Steps, codec: e.cfg.Codec, engine: e,
	}
	if r.CompletedAt != 0 {
		s.CompletedAt = store.FromMillis(r.CompletedAt)
	}
	if r.Status == store.StatusFailed {
		s.Err = terminalFromRecord(r.Err)
	}
	return s
}

// StateOf returns the State of r, a record read from the engine's store
// other than through [Engine.Status] (by a [store.Lister], say): its
// [State.Token] is signed with the engine's Config.TokenKey, as the
// tokens of every State the engine returns are. Hand its token only to
// code entitled to settle the key.
func (e *Engine) StateOf(r *store.Record) *State { return e.state(r) }

// Decode decodes a COMPLETED record's result into v with the engine's
// codec.
func (s *State) Decode(v any) error {
	if s.Status != StatusCompleted {
		return fmt.Errorf("idem: %s is %s; only a COMPLETED record has a result", s.Key, s.Status)
	}
	if err := s.codec.Unmarshal(s.Result, v); err != nil {
		return &store.CorruptError{Key: s.Key, Reason: fmt.Sprintf("stored result does not decode into %T: %v", v, err)}
	}
	return nil
}

// Overdue reports whether the record is IN_PROGRESS past its expected
// completion at now: the work should have finished and has not (stuck).
func (s *State) Overdue(now time.Time) bool {
	return s.Status == StatusInProgress && !now.Before(s.LeaseUntil)
}

// Token returns the token of the record's claim, requiring the record's
// current status: for an IN_PROGRESS record the holder's token, for a
// settled one a token that can correct it (complete a FAILED record whose
// workflow was redriven to success, release it to run again). Every write
// through it is refused if the record changed in between. Hand it only to
// code entitled to settle the key.
func (s *State) Token() Token {
	return tokenOf(s.engine, s.Key, s.Fence, s.Owner, s.Status, observe.TraceContext{})
}

// Status returns the record of key, read with strong consistency: for
// status endpoints, workers and operators. A key with no live record
// (absent or expired) gives an error matching [ErrNotFound]; a store
// failure a [*StoreError].
func (e *Engine) Status(ctx context.Context, key StoreKey) (_ *State, err error) {
	k := key.String()
	c := call{e: e, key: k, name: key.Operation}
	if e.tracer != nil {
		ctx = c.startSpan(ctx, observe.CallStatus, observe.TraceContext{})
		defer func() { c.endSpan(observe.CallEnd{Err: err}) }()
	}
	var r *store.Record
	sctx, ss := c.storeSpan(ctx, observe.StoreGet)
	err = e.timed(observe.StoreGet, func() (err error) {
		r, err = e.store.Get(sctx, k)
		return err
	})
	endStore(ss, err)
	if errors.Is(err, store.ErrNotFound) || (err == nil && r.Expired(store.Millis(e.cfg.Clock.Now()))) {
		return nil, fmt.Errorf("idem: no live record for %s: %w", k, store.ErrNotFound)
	}
	if err != nil {
		return nil, &StoreError{Op: observe.StoreGet, Key: k, Err: err}
	}
	return e.state(r), nil
}

// BeginOptions configure [Engine.Begin]. A nil *BeginOptions means all
// defaults.
type BeginOptions struct {
	// ExpectedCompletion is how long the work should take: the claim's
	// lease, after which the record counts as stuck and another caller
	// may take the key over (unless the work extends it with
	// [Engine.Extend]). It is separate from the replay expiry
	// (Config.Expiry) and at most that. Default Config.Lease.
	ExpectedCompletion time.Duration
}

// Begun is the answer of [Engine.Begin].
type Begun struct {
	// Acquired is true when this call claimed the key: Token names the
	// claim, to hand to the work.
	Acquired bool
	// Takeover is true when the claim replaced an IN_PROGRESS record whose
	// expected completion had passed.
	Takeover bool
	// Token is the new claim's token when Acquired, else zero.
	Token Token
	// State is the record: the new claim when Acquired, else the existing
	// outcome — COMPLETED (decode its result: a replay), FAILED (its
	// terminal error) or IN_PROGRESS (the holder, its execution reference
	// and expected completion).
	State *State
}

// Begin claims the key req names without running anything: the work is
// handed to something else (a workflow, a worker, another process), which
// finishes it later through the returned token with [Engine.Complete] or
// [Engine.Fail]. The claim's lease is the expected completion
// (BeginOptions); it is not renewed by the engine — the work heartbeats
// with [Engine.Extend] if it needs longer.
//
// The answer is either a new claim (Begun.Acquired, with its Token) or the
// key's existing record, in one store round trip; neither is an error. A
// payload that differs from the stored one fails with a
// [*MismatchError]; a store failure with a [*StoreError] (Begin fails
// closed whatever Config.FailOpen says, since nothing runs). With
// Config.Disabled, Begin claims nothing and returns Acquired with a token
// whose writes do nothing.
//
// The claim's owner is the engine's, plus the label of [WithOwnerLabel] when
// ctx carries one (a request or invocation ID), so operators can tell who
// claimed the key.
func (e *Engine) Begin(ctx context.Context, req Request, o *BeginOptions) (Begun, error) {
	id, err := req.Identity()
	if err != nil {
		return Begun{}, err
	}
	return e.BeginIdentity(ctx, id, o)
}

// BeginIdentity is [Engine.Begin] for a precomputed [Identity].
func (e *Engine) BeginIdentity(ctx context.Context, id Identity, o *BeginOptions) (b Begun, err error) {
	c := &call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.storedForm(), hold: id.HoldCrashed}
	if e.tracer != nil {
		ctx = c.startSpan(ctx, observe.CallBegin, observe.TraceContext{})
		defer func() {
			c.endSpan(observe.CallEnd{Replayed: b.State != nil && !b.Acquired && b.State.Status != StatusInProgress, Fence: b.Token.Fence, Err: err})
		}()
	}
	lease := e.cfg.Lease
	if o != nil && o.ExpectedCompletion != 0 {
		lease = o.ExpectedCompletion
	}
	if lease <= 0 || lease > e.cfg.Expiry {
		return Begun{}, fmt.Errorf("%w: expected completion %v must be positive and at most Expiry (%v)", ErrInvalidArgument, lease, e.cfg.Expiry)
	}
	if e.cfg.Disabled {
		c.observe(observe.OutcomeUnprotected)
		return Begun{Acquired: true, Token: disabledToken(id.StoreKey)}, nil
	}
	if err := ctx.Err(); err != nil {
		return Begun{}, err
	}
	e.syncClock(ctx)
	res, err := c.claim(ctx, e.cfg.Clock.Now(), lease, false)
	if err != nil {
		return Begun{}, err
	}
	if err := c.mismatch(res.Record.Fingerprint); err != nil {
		return Begun{}, err
	}
	b = Begun{Acquired: res.Acquired, Takeover: res.Takeover, State: e.state(res.Record)}
	switch {
	case res.Acquired:
		c.noteAcquired(res)
		b.Token = e.sign(Token{Key: id.StoreKey, Fence: res.Record.Fence, Owner: res.Record.Owner, Status: StatusInProgress})
		b.Token.trace = c.traceContext()
	case res.Record.Held(store.Millis(e.cfg.Clock.Now())):
		c.observe(observe.OutcomeHeld)
	case res.Record.Status == store.StatusInProgress:
		c.observe(observe.OutcomeInProgress)
	default:
		c.observe(observe.OutcomeReplayed)
	}
	return b, nil
}

// disabledOwner is the owner of the tokens a disabled engine hands out:
// they name no claim, and writes through them do nothing.
const disabledOwner = "idem-disabled"

func disabledToken(k StoreKey) Token {
	return Token{Key: k, Fence: 1, Owner: disabledOwner, Status: StatusInProgress}
}

// disabledKey marks the context of an operation a disabled engine runs,
// with its store key, so that Detach answers it.
type disabledKey struct{}

// tokenHolder is the holder of a token's claim, for the engine's retried,
// fenced outcome writes, the store's clock measured first when due. A
// local cache forgets the key: a write through a token may change a
// settled record this engine has cached.
func (e *Engine) tokenHolder(ctx context.Context, t Token, span observe.Span) *holder {
	e.syncClock(ctx)
	if e.cache != nil {
		e.cache.forget(t.Key.String())
	}
	return &holder{
		call:  call{e: e, key: t.Key.String(), name: t.Key.Operation, span: span},
		fence: t.Fence, owner: t.Owner, from: t.Status,
	}
}

// endToken ends the span of a write through t, when it has one.
func endToken(sp observe.Span, t Token, err error) {
	if sp != nil {
		sp.End(observe.CallEnd{Fence: t.Fence, Err: err})
	}
}

// tokenWrite answers a write through t: nil, a [*StaleTokenError] when the
// store refused it, or the store's failure as a [*StoreError].
func tokenWrite(op observe.StoreOp, t Token, err error) error {
	if err == nil {
		return nil
	}
	if store.TakenOver(err) {
		return staleToken(op, t, err)
	}
	var se *StoreError
	if errors.As(err, &se) {
		return err
	}
	return &StoreError{Op: op, Key: t.Key.String(), Err: err}
}

// Complete records v (encoded with the engine's codec) as the outcome of
// t's claim: the record becomes COMPLETED and later calls with the key
// replay v. The write is fenced — refused with a [*StaleTokenError] when
// t's claim is no longer the record's, or the record is no longer in the
// status t names — and retried on transient store faults while
// Config.WriteTimeout lasts; a retry that finds its own write landed
// succeeds. A result over Config.MaxResultBytes or the store's limit is
// replaced by the [CodeResultTooLarge] marker, as for [Do], and Complete
// returns nil: the key is settled. Writes through a token of a disabled
// engine do nothing.
func (e *Engine) Complete(ctx context.Context, t Token, v any) error {
	return e.throughToken(ctx, observe.CallComplete, t, func(ctx context.Context, h *holder) error {
		b, err := e.cfg.Codec.Marshal(v)
		if err != nil {
			return &encodeError{err}
		}
		return tokenWrite(observe.StoreComplete, t, h.complete(ctx, b, nil))
	})
}

// throughToken is the frame of every write through t: nothing for a
// disabled engine, the write's span when the observer traces, t checked
// (its signature), then write with t's holder.
func (e *Engine) throughToken(ctx context.Context, kind observe.CallKind, t Token, write func(context.Context, *holder) error) (err error) {
	if e.cfg.Disabled {
		return nil
	}
	var sp observe.Span
	if e.tracer != nil {
		ctx, sp = e.tokenSpan(ctx, kind, t)
		defer func() { endToken(sp, t, err) }()
	}
	if err := e.verify(t); err != nil {
		return err
	}
	return write(ctx, e.tokenHolder(ctx, t, sp))
}

// Fail records err as the terminal outcome of t's claim: the record
// becomes FAILED and later calls with the key get the error. A
// [*TerminalError] keeps its code, message and body; any other error is
// stored with its message and no code. Fenced and retried as
// [Engine.Complete] is.
func (e *Engine) Fail(ctx context.Context, t Token, err error) error {
	if err == nil && !e.cfg.Disabled {
		return errors.New("idem: Fail needs an error to store")
	}
	return e.throughToken(ctx, observe.CallFail, t, func(ctx context.Context, h *holder) error {
		var term *TerminalError
		if !errors.As(err, &term) {
			term = &TerminalError{Message: err.Error()}
		}
		return tokenWrite(observe.StoreFail, t, h.fail(ctx, term.record()))
	})
}

// Release deletes t's claim so that the key can run again: for work that
// could not start or failed in a way worth retrying. A claim that is gone
// already counts as released. Fenced and retried as [Engine.Complete] is.
func (e *Engine) Release(ctx context.Context, t Token) error {
	return e.throughToken(ctx, observe.CallRelease, t, func(ctx context.Context, h *holder) error {
		return tokenWrite(observe.StoreRelease, t, h.release(ctx))
	})
}

// Extend moves t's expected completion to now + d, in one fenced store
// call: the heartbeat of long work, which keeps the key from being taken
// over. The claim still ends at the record's expiry. A refused Extend
// ([*StaleTokenError]) tells the work that its claim is gone and its
// outcome will not be recorded.
func (e *Engine) Extend(ctx context.Context, t Token, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: Extend needs a positive duration, not %v", ErrInvalidArgument, d)
	}
	return e.touch(ctx, t, observe.CallExtend, func(p *store.ExtendParams) { p.LeaseUntil = p.Now + max(d.Milliseconds(), 1) })
}

// Attach records ref — the execution the work was handed to, such as a
// workflow execution's ARN or a job's URL — on t's claim, in one fenced
// store call. Duplicates and operators see it ([State.Ref]); attaching
// again replaces it.
func (e *Engine) Attach(ctx context.Context, t Token, ref string) error {
	if err := validRef(ref); err != nil {
		return err
	}
	return e.touch(ctx, t, observe.CallAttach, func(p *store.ExtendParams) { p.Ref = ref })
}

// touch makes one fenced Extend through t, retried on transient faults
// while Config.WriteTimeout lasts.
func (e *Engine) touch(ctx context.Context, t Token, kind observe.CallKind, set func(*store.ExtendParams)) error {
	op := observe.StoreExtend
	if kind == observe.CallAttach {
		op = observe.StoreAttach
	}
	return e.throughToken(ctx, kind, t, func(ctx context.Context, h *holder) error {
		err := h.write(ctx, writeReq{kind: writeExtend, extend: set})
		if store.TakenOver(err) {
			h.observe(observe.OutcomeFenced)
		}
		return tokenWrite(op, t, err)
	})
}

// ownerLabelKey carries the label of WithOwnerLabel.
type ownerLabelKey struct{}

// WithOwnerLabel returns a copy of ctx whose claims are labelled who — a
// request ID, a Lambda invocation's request ID, a job name — in the
// record's owner (State.Owner), so that operators can tell who claimed
// a key. Characters other than printable ASCII become '_' and the label is
// cut to MaxOwnerLabelLen.
func WithOwnerLabel(ctx context.Context, who string) context.Context {
	if len(who) > MaxOwnerLabelLen {
		who = who[:MaxOwnerLabelLen]
	}
	who = strings.Map(func(r rune) rune {
		if r < 0x21 || r > 0x7e {
			return '_'
		}
		return r
	}, who)
	return context.WithValue(ctx, ownerLabelKey{}, who)
}

type holderKey struct{}

// Detach hands the claim of the operation running in ctx (under [Do],
// [DoIdentity] or [Op.Do]) to work that outlives the call — a queued job,
// a workflow, a Lambda handler's follow-up — and returns its [Token]. The
// claim's expected completion becomes now + expectedCompletion (at most the
// record's expiry) and ref, when not empty, is attached as its execution
// reference, in one fenced store write; the engine stops renewing the
// lease, and when the operation returns it records nothing: neither the
// value nor an error, nor a release. The record stays IN_PROGRESS until
// the token's holder settles it with [Engine.Complete] or [Engine.Fail],
// or its expected completion passes (then a retry may take the key over).
// Duplicates meanwhile get an [*InProgressError] carrying ref.
//
// This is how a handler answers "202 Accepted" (idemhttp's Accept), and
// how a Lambda handler holds its claim past its own invocation deadline.
// Detaching again moves the expected completion and the reference again.
// When the write fails (the claim was lost, the store is down) the claim
// is not handed off and the call's outcome is recorded as usual.
func Detach(ctx context.Context, expectedCompletion time.Duration, ref string) (Token, error) {
	h, ok := ctx.Value(holderKey{}).(*holder)
	if !ok {
		if k, disabled := ctx.Value(disabledKey{}).(StoreKey); disabled {
			return disabledToken(k), nil // nothing is claimed, nothing to hand off
		}
		return Token{}, errors.New("idem: Detach called outside an operation run by Do")
	}
	e := h.e
	if expectedCompletion <= 0 || expectedCompletion > e.cfg.Expiry {
		return Token{}, fmt.Errorf("%w: expected completion %v must be positive and at most Expiry (%v)", ErrInvalidArgument, expectedCompletion, e.cfg.Expiry)
	}
	if ref != "" {
		if err := validRef(ref); err != nil {
			return Token{}, err
		}
	}
	t := Claim{Key: h.key, Fence: h.fence, Owner: h.owner, e: e, trace: h.traceContext()}.Token()
	if t.IsZero() {
		return Token{}, fmt.Errorf("idem: the claim's key %q does not parse", h.key)
	}
	// No renewal may move the lease back once it is handed off; if the
	// hand-off fails the operation goes on in its caller, renewed again.
	h.stopRenewal()
	var until int64
	err := h.write(ctx, writeReq{kind: writeExtend, extend: func(p *store.ExtendParams) {
		until = min(p.Now+max(expectedCompletion.Milliseconds(), 1), h.expiresAt)
		p.LeaseUntil, p.Ref = until, ref
	}})
	if err != nil {
		h.resumeRenewal()
		return Token{}, tokenWrite(observe.StoreExtend, t, err)
	}
	if h.flight != nil {
		h.flight.leaseUntil.Store(until)
		if ref != "" {
			h.flight.ref.Store(&ref)
		}
	}
	h.detached.Store(true)
	h.event(observe.Event{Kind: observe.EventDetach, LeaseUntil: store.FromMillis(until)})
	return t, nil
}

// validRef checks an execution reference.
func validRef(ref string) error {
	if ref == "" || len(ref) > MaxRefLen || strings.IndexFunc(ref, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%w: execution reference must be 1 to %d printable characters", ErrInvalidArgument, MaxRefLen)
	}
	return nil
}
