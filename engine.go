package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Engine runs operations at most once per key. It is safe for concurrent
// use; create one per store and share it.
type Engine struct {
	store store.Store
	cfg   Config
	cache *lru
	// ownerPrefix starts the owner of every claim: the configured owner and
	// a random id of this engine, so owners never repeat across engines
	// and processes even when Config.Owner does.
	ownerPrefix string
	seq         atomic.Uint64

	timing   bool           // the observer wants store-call latencies
	tracer   observe.Tracer // the observer traces: nil when it does not
	dbSystem string         // the store's store.SystemNamer name, for its spans
	raw      bool           // the codec is RawCodec or JSONCodec: []byte and json.RawMessage results skip it
	sysClock bool           // the clock is store.SystemClock

	// completer batches the Completes of calls that finish together, when
	// the store can (store.BatchCompleter); nil otherwise.
	completer *completer

	mu       sync.Mutex
	flights  map[string]*flight
	renewals renewals
}

// New returns an engine over s. A nil cfg means all defaults. It fails
// with [ErrInvalidConfig] when a field is out of range, saying which.
func New(s store.Store, cfg *Config) (*Engine, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	e := &Engine{store: s, cfg: c, ownerPrefix: c.Owner + "/" + randomID(), flights: make(map[string]*flight)}
	_, nop := c.Observer.(nopObserver)
	switch c.Codec.(type) {
	case RawCodec, JSONCodec: // []byte and json.RawMessage results are stored as they are
		e.raw = true
	}
	_, e.sysClock = c.Clock.(store.SystemClock)
	e.timing = !nop
	e.tracer, _ = c.Observer.(observe.Tracer)
	if sn, ok := s.(store.SystemNamer); ok {
		e.dbSystem = sn.SystemName()
	}
	e.renewals.init(e)
	if bc, ok := s.(store.BatchCompleter); ok {
		e.completer = &completer{s: s, b: bc, attempt: max(c.WriteTimeout/3, time.Millisecond)}
	}
	if c.Cache != nil {
		e.cache = newLRU(c.Cache.withDefaults())
	}
	if c.Disabled {
		c.Logger.Warn("idem: idempotency is DISABLED; every operation runs unprotected",
			"env", EnvDisabled)
	}
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.store }

// Config returns the engine's configuration, with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Result is the outcome of a successful call.
type Result[T any] struct {
	// Value is the operation's result, or the replayed one.
	Value T
	// Replayed is true when Value (or the returned terminal error) came
	// from an earlier execution instead of running the operation now. A
	// replay is not an error.
	Replayed bool
	// StoreKey is the store key of the call.
	StoreKey string
	// Fence is the fence under which this call ran the operation, 0 on a
	// replay.
	Fence uint64
	// Recorded is the status this call's outcome write left the record in,
	// when this call ran the operation: COMPLETED, or FAILED (a terminal
	// error, or the marker of a result that could not be stored). Zero when
	// nothing was recorded for it — the write was refused (the key was
	// taken over) or failed past WriteTimeout, the claim was released,
	// kept (uncertain) or handed off — and on a replay. Adapters that
	// acknowledge a message by the outcome read it instead of the store.
	Recorded Status
	// Unrecorded is the store's last answer when this call ran the
	// operation but its outcome write (the Complete or Fail, or the
	// Release of a retryable error) did not land, after the engine's
	// retries: an error matching store.ErrFenced or store.ErrNotFound when
	// the key was taken over meanwhile (the write was refused), or
	// store.ErrUnavailable when the store failed for all of WriteTimeout.
	// Nil otherwise. The consumers' verdict (package consume) reads it.
	Unrecorded error
}

// Do runs fn at most once for the key that req names. See [DoIdentity].
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
	return doTyped(ctx, e, id, fn, nil)
}

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
	e      *Engine
	claim  Claim
	result []byte
}

// Params encodes v with the engine's codec and returns the parameters of
// the Complete that records it under this call's claim. The operation makes
// that Complete itself, inside its own transaction.
func (c *Completion[T]) Params(v T) (store.CompleteParams, error) {
	b, err := c.e.cfg.Codec.Marshal(v)
	if err != nil {
		return store.CompleteParams{}, &encodeError{err}
	}
	c.result = b
	now := store.Millis(c.e.cfg.Clock.Now())
	return store.CompleteParams{ClaimRef: store.ClaimRef{Key: c.claim.Key, Fence: c.claim.Fence, Owner: c.claim.Owner, Now: now},
		ExpiresAt: now + c.e.cfg.Expiry.Milliseconds(), Result: b}, nil
}

// doTyped is the typed layer of every call: it runs fn, or completing, an
// operation that may record its own success (DoCompleting), so that a
// plain Do pays nothing for it.
func doTyped[T any](ctx context.Context, e *Engine, id Identity, fn func(context.Context) (T, error), completing func(context.Context, *Completion[T]) (T, error)) (Result[T], error) {
	if e.cfg.Disabled {
		e.cfg.Observer.Observe(id.StoreKey.Operation, observe.OutcomeUnprotected)
		var sp observe.Span
		if e.tracer != nil {
			c := call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation}
			ctx = c.startSpan(ctx, observe.CallDo, observe.TraceContext{})
			sp = c.span
			sp.Outcome(observe.OutcomeUnprotected)
		}
		v, err := callOp(context.WithValue(ctx, disabledKey{}, id.StoreKey), fn, completing, &Completion[T]{e: e})
		if sp != nil {
			sp.End(observe.CallEnd{Err: err})
		}
		return Result[T]{Value: v, StoreKey: id.StoreKey.String()}, err
	}
	// One allocation holds the whole call: its claim, its in-process
	// flight, its contexts and the typed value.
	t := &typedCall[T]{fn: fn, completing: completing, keep: e.cache != nil && cacheable[T]()}
	t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.Fingerprint, op: t}
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
		v, ferr := callOp(ctx, fn, completing, &Completion[T]{e: e})
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
func callOp[T any](ctx context.Context, fn func(context.Context) (T, error), completing func(context.Context, *Completion[T]) (T, error), c *Completion[T]) (T, error) {
	if fn != nil {
		return fn(ctx)
	}
	return completing(ctx, c)
}

// typedCall is a call of an operation returning T.
type typedCall[T any] struct {
	holder
	fn         func(context.Context) (T, error)
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

// encode encodes t.value with the engine's codec; a [RawCodec] or
// [JSONCodec] engine takes a []byte or json.RawMessage value as it is,
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

// outcome is what run hands back to the typed layer.
type outcome struct {
	replayed   bool
	result     []byte       // encoded value to decode, on a replay
	value      any          // the value itself, from the local cache
	fence      uint64       // fence held while running, when this call ran fn
	recorded   store.Status // the status the outcome write left, when it landed
	unrecorded error        // the outcome write's last error, when it did not land
}

// call is one call through the engine, before it holds a claim: what every
// step needs, derived once.
type call struct {
	e           *Engine
	key         string // the store key
	name        string // the operation's name (the first part of the key's scope), for the observer
	fingerprint string
	op          operation
	span        observe.Span // the call's span, when the observer traces it
}

// flight lets concurrent duplicates inside one process share one claim.
// Its signals make their channels only when a duplicate waits on them, so
// a call without duplicates pays for none.
type flight struct {
	claimed  signal // fired once the leader's claim has answered
	claimRec *store.Record
	acquired bool
	claimErr error
	// leaseUntil is the claim's lease as last written, renewals included.
	leaseUntil atomic.Int64

	done      signal        // fired once the leader has finished
	final     *store.Record // COMPLETED or FAILED outcome, nil when released
	followers int           // duplicates that joined, under Engine.mu
	// ref is the execution reference the leader attached when it handed
	// its claim off ([Detach]), for the followers' InProgressError.
	ref atomic.Pointer[string]
}

// signal is a one-shot event whose channel is made by the first waiter.
type signal struct {
	mu    sync.Mutex
	fired bool
	ch    chan struct{}
}

// closed is the channel of every signal fired before anyone waited.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// wait returns a channel closed once the signal fires.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fired {
		return closed
	}
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// hasFired reports whether the signal has fired.
func (s *signal) hasFired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fired
}

// fire fires the signal; what was written before it is visible to every
// waiter after.
func (s *signal) fire() {
	s.mu.Lock()
	s.fired = true
	if s.ch != nil {
		close(s.ch)
	}
	s.mu.Unlock()
}

// join returns the in-process flight for key: the one in flight (leader =
// false), or f, which becomes the key's flight (leader = true).
func (e *Engine) join(key string, f *flight) (_ *flight, leader bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if g, ok := e.flights[key]; ok {
		g.followers++
		return g, false
	}
	e.flights[key] = f
	return f, true
}

// land ends a flight: later callers start their own. The final record its
// followers replay is built (by final, when not nil) only when there are
// followers.
func (e *Engine) land(key string, f *flight, h *holder) {
	e.mu.Lock()
	delete(e.flights, key)
	followers := f.followers
	e.mu.Unlock()
	if followers > 0 && h != nil {
		f.final = h.final()
	}
	f.done.fire()
}

// mismatch checks the call's fingerprint against a stored one: the one
// check of every path (cache, store conflict, in-process flight).
func (c *call) mismatch(stored string) error {
	if stored == c.fingerprint {
		return nil
	}
	c.observe(observe.OutcomeMismatch)
	return &MismatchError{Key: c.key, Stored: stored, Got: c.fingerprint}
}

// fromCache answers the call from a cache entry: the replay, or a
// mismatch. The cache's one answer, on every path.
func (c *call) fromCache(ent lruEntry) (outcome, error) {
	if err := c.mismatch(ent.fingerprint); err != nil {
		return outcome{}, err
	}
	c.observe(observe.OutcomeCacheHit)
	return outcome{replayed: true, result: ent.result, value: ent.value}, nil
}

// cached answers the call from the local cache at now (ms), when it holds
// the key.
func (c *call) cached(now int64) (out outcome, hit bool, err error) {
	if c.e.cache == nil {
		return outcome{}, false, nil
	}
	ent, ok := c.e.cache.get(c.key, now)
	if !ok {
		return outcome{}, false, nil
	}
	out, err = c.fromCache(ent)
	return out, true, err
}

// known is what a call of a batch knows when it enters run: the flight it
// joined and, when it leads that flight, its claim's answer (made with the
// batch's other claims at now, with lease).
type known struct {
	f      *flight
	leader bool
	now    time.Time
	lease  time.Duration
	res    store.ClaimResult
	err    error
}

// run is the one path of a call through the engine: the cache, then the
// key's in-process flight — leading it (the claim, then the operation) or
// following it — going round while another holder keeps the key and
// Config.Wait lasts. k, when not nil, is what a batch already did for the
// call's first round (DoBatch); nil for Do.
func (h *holder) run(ctx context.Context, k *known) (outcome, error) {
	e := h.e
	if k == nil {
		if out, hit, err := h.cached(store.Millis(e.cfg.Clock.Now())); hit {
			return out, err
		}
	}
	var deadline time.Time
	if e.cfg.Wait > 0 {
		deadline = e.cfg.Clock.Now().Add(e.cfg.Wait)
	}
	backoff := e.cfg.WaitBackoff
	for {
		var (
			out   outcome
			err   error
			retry bool
		)
		f, leader := h.enter(k)
		switch {
		case leader && k != nil:
			out, err = h.claimed(ctx, f, k.now, k.lease, k.res, k.err)
		case leader:
			out, err = h.lead(ctx, f)
		default:
			out, retry, err = h.follow(ctx, f, deadline)
		}
		k = nil
		if retry {
			continue
		}
		if err == nil {
			return out, nil
		}
		ipe, busy := asInProgress(err)
		// Work handed elsewhere (a reference is attached) runs for its
		// expected completion, not for a wait's worth: answer at once.
		if busy && e.cfg.Wait > 0 && ipe.Ref == "" {
			h.event(observe.Event{Kind: observe.EventWait, Owner: ipe.Owner, LeaseUntil: ipe.LeaseUntil})
			if werr := e.pause(ctx, deadline, &backoff); werr == nil {
				continue
			} else if !errors.Is(werr, ErrInProgress) {
				return outcome{}, werr
			}
		}
		if busy {
			h.observe(observe.OutcomeInProgress)
		}
		return out, err
	}
}

// enter returns the flight the call takes part in this round: the one k
// names, or the key's flight in this process, joined (leader = false), or
// else one the call brings and leads.
func (h *holder) enter(k *known) (f *flight, leader bool) {
	if k != nil {
		return k.f, k.leader
	}
	fresh := &h.fl
	if h.flUsed {
		fresh = new(flight) // a flight is never reused: followers may still read it
	}
	f, leader = h.e.join(h.key, fresh)
	h.flUsed = h.flUsed || leader
	return f, leader
}

// asInProgress returns err's *InProgressError, if it has one. The target
// of errors.As lives here so that only failing calls allocate it.
func asInProgress(err error) (*InProgressError, bool) {
	var ipe *InProgressError
	ok := errors.As(err, &ipe)
	return ipe, ok
}

// pause waits one backoff step before the next claim attempt. It returns
// ErrInProgress when the wait budget is spent, or the context's error.
func (e *Engine) pause(ctx context.Context, deadline time.Time, backoff *time.Duration) error {
	remaining := deadline.Sub(e.cfg.Clock.Now())
	if remaining <= 0 {
		return ErrInProgress
	}
	d := *backoff/2 + rand.N(*backoff/2+1)
	d = min(d, remaining)
	*backoff = min(*backoff*2, e.cfg.MaxWaitBackoff)
	select {
	case <-e.cfg.Clock.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow handles a duplicate that found its key already in flight in this
// process. retry asks the caller to go round again (the leader released).
func (c *call) follow(ctx context.Context, f *flight, deadline time.Time) (out outcome, retry bool, err error) {
	e := c.e
	c.event(observe.Event{Kind: observe.EventJoin})
	select {
	case <-f.claimed.wait():
	case <-ctx.Done():
		return outcome{}, false, ctx.Err()
	}
	if f.claimErr != nil {
		return outcome{}, false, f.claimErr
	}
	rec := f.claimRec
	if f.acquired {
		// Held by the leader, in this process: the record as it stands,
		// with the lease as last renewed (while the leader writes the
		// outcome it may have run out in this process's view, but the key
		// is still held) and the reference the leader attached.
		held := *rec
		held.LeaseUntil = max(f.leaseUntil.Load(), store.Millis(e.cfg.Clock.Now()))
		if ref := f.ref.Load(); ref != nil {
			held.Ref = *ref
		}
		rec = &held
	}
	out, err = c.existing(rec)
	busy, ok := asInProgress(err)
	if !ok || !f.acquired || e.cfg.Wait == 0 || busy.Ref != "" {
		// Answered; or held by another process, which run waits out
		// claiming again; or handed-off work: no wait.
		return out, false, err
	}
	var timeout <-chan time.Time
	if d := deadline.Sub(e.cfg.Clock.Now()); d > 0 {
		timeout = e.cfg.Clock.After(d)
	} else {
		return outcome{}, false, busy
	}
	select {
	case <-f.done.wait():
	case <-ctx.Done():
		return outcome{}, false, ctx.Err()
	case <-timeout:
		return outcome{}, false, busy
	}
	if f.final == nil {
		return outcome{}, true, nil
	}
	out, err = c.replay(f.final)
	return out, false, err
}

// existing answers a call from a live record held by someone else.
func (c *call) existing(rec *store.Record) (outcome, error) {
	if err := c.mismatch(rec.Fingerprint); err != nil {
		return outcome{}, err
	}
	switch rec.Status {
	case store.StatusCompleted, store.StatusFailed:
		c.observe(observe.OutcomeReplayed)
		if c.e.cache != nil {
			c.e.cache.put(rec.Key, rec.Fingerprint, rec.Result, nil, rec.Status, rec.ExpiresAt)
		}
		return c.replay(rec)
	case store.StatusInProgress:
		return outcome{}, &InProgressError{Key: c.key, LeaseUntil: store.FromMillis(rec.LeaseUntil), Owner: rec.Owner, Ref: rec.Ref}
	}
	return outcome{}, &store.CorruptError{Key: c.key, Reason: "record has invalid status " + rec.Status.String()}
}

func (c *call) replay(rec *store.Record) (outcome, error) {
	switch rec.Status {
	case store.StatusCompleted:
		return outcome{replayed: true, result: rec.Result}, nil
	case store.StatusFailed:
		return outcome{replayed: true}, terminalFromRecord(rec.Err)
	}
	return outcome{}, &store.CorruptError{Key: c.key, Reason: "replay of a record in status " + rec.Status.String()}
}

// owner returns a claim owner unique to this call: the engine's owner
// prefix (the configured owner and a random instance id) and a sequence
// number. Stores check it on every fenced write, so it must never repeat.
//
// A label given with [WithOwnerLabel] ends it, after another '/'.
func (e *Engine) owner(ctx context.Context) string {
	var b [24]byte
	seq := strconv.AppendUint(b[:0], e.seq.Add(1), 10)
	by, _ := ctx.Value(ownerLabelKey{}).(string)
	var sb strings.Builder
	sb.Grow(len(e.ownerPrefix) + 2 + len(seq) + len(by))
	sb.WriteString(e.ownerPrefix)
	sb.WriteByte('/')
	sb.Write(seq)
	if by != "" {
		sb.WriteByte('/')
		sb.WriteString(by)
	}
	return sb.String()
}

// lead claims the key for this call and, when acquired, runs the operation.
func (h *holder) lead(ctx context.Context, f *flight) (outcome, error) {
	now, lease, err := h.e.leaseFor(ctx)
	if err != nil {
		return h.claimed(ctx, f, now, lease, store.ClaimResult{}, err)
	}
	res, err := h.claim(ctx, now, lease, true)
	return h.claimed(ctx, f, now, lease, res, err)
}

// leaseFor returns the time of a claim made now, and its lease: the
// context's deadline, or Config.Lease, at most Config.Expiry. A context
// that has ended, or a deadline passed, is an error.
func (e *Engine) leaseFor(ctx context.Context) (time.Time, time.Duration, error) {
	now := e.cfg.Clock.Now()
	lease := e.cfg.Lease
	if dl, ok := ctx.Deadline(); ok {
		lease = dl.Sub(now)
	}
	if err := ctx.Err(); err != nil || lease <= 0 {
		if err == nil {
			err = context.DeadlineExceeded
		}
		return now, 0, err
	}
	return now, min(lease, e.cfg.Expiry), nil
}

// claimed answers the call from its claim's answer (res, or err) and tells
// the flight's followers; when the claim was acquired it runs the
// operation.
func (h *holder) claimed(ctx context.Context, f *flight, now time.Time, lease time.Duration, res store.ClaimResult, err error) (outcome, error) {
	e := h.e
	tell(f, res, err)
	if err != nil {
		e.land(h.key, f, nil)
		return outcome{}, err
	}
	if !res.Acquired {
		e.land(h.key, f, nil)
		return h.existing(res.Record)
	}
	return h.acquired(ctx, f, now, lease, res)
}

// tell gives the flight's followers the claim's answer (res, or err),
// once: a batch tells every flight before any of its operations runs, and
// its leaders then go the one path, which tells again. Only the flight's
// leader calls it.
func tell(f *flight, res store.ClaimResult, err error) {
	if f.claimed.hasFired() {
		return
	}
	if err != nil {
		f.claimErr = err
	} else {
		f.claimRec, f.acquired = res.Record, res.Acquired
		f.leaseUntil.Store(res.Record.LeaseUntil)
	}
	f.claimed.fire()
}

// acquired runs the operation under the claim res acquired at now, its
// followers told.
func (h *holder) acquired(ctx context.Context, f *flight, now time.Time, lease time.Duration, res store.ClaimResult) (outcome, error) {
	e := h.e
	h.observe(observe.OutcomeAcquired)
	if res.Takeover {
		e.cfg.Observer.Observe(h.name, observe.OutcomeTakeover)
		h.event(observe.Event{Kind: observe.EventTakeover, Fence: res.Record.Fence, Owner: res.Record.Owner})
		e.cfg.Logger.Info("idem: took over a claim whose lease had passed", "key", h.key, "fence", res.Record.Fence)
	}
	h.fence, h.owner, h.expiresAt, h.lease, h.flight = res.Record.Fence, res.Record.Owner, res.Record.ExpiresAt, lease, f
	return h.execute(ctx, now)
}

// claim makes the store's Claim of the call's key at now, with lease: the
// one claim of Do and Begin. local says this process holds the claim (Do),
// rather than a token handed out (Begin). A store failure is counted and
// returned as a [*StoreError].
func (c *call) claim(ctx context.Context, now time.Time, lease time.Duration, local bool) (store.ClaimResult, error) {
	e := c.e
	p := c.claimParams(ctx, now, lease, local)
	start := e.callStart(now)
	sctx, ss := c.storeSpan(ctx, observe.StoreClaim)
	res, err := e.store.Claim(sctx, p)
	e.callEnd(observe.StoreClaim, start, err)
	endStore(ss, err)
	return c.claimAnswer(res, err)
}

// claimParams are the parameters of the call's claim at now, with lease.
func (c *call) claimParams(ctx context.Context, now time.Time, lease time.Duration, local bool) store.ClaimParams {
	nowMs := store.Millis(now)
	return store.ClaimParams{
		Key:         c.key,
		Fingerprint: c.fingerprint,
		Owner:       c.e.owner(ctx),
		Now:         nowMs,
		LeaseUntil:  nowMs + max(lease.Milliseconds(), 1),
		ExpiresAt:   nowMs + c.e.cfg.Expiry.Milliseconds(),
		Local:       local,
	}
}

// claimAnswer checks a store's answer to the call's claim: a failure is
// counted and returned as a [*StoreError].
func (c *call) claimAnswer(res store.ClaimResult, err error) (store.ClaimResult, error) {
	if err == nil && res.Record == nil {
		err = &store.CorruptError{Key: c.key, Reason: "store answered a claim with no record"}
	}
	if err != nil {
		c.observe(observe.OutcomeStoreError)
		return store.ClaimResult{}, &StoreError{Op: observe.StoreClaim, Key: c.key, Err: err}
	}
	return res, nil
}

// callStart returns when a store call starts, for its latency: now when
// the caller has read the clock already, and nothing when no observer
// wants latencies.
func (e *Engine) callStart(now time.Time) time.Time {
	if !e.timing || !now.IsZero() {
		return now
	}
	return e.cfg.Clock.Now()
}

// callEnd reports a store call's latency to the observer.
func (e *Engine) callEnd(op observe.StoreOp, start time.Time, err error) {
	if e.timing {
		e.cfg.Observer.StoreCall(op, e.cfg.Clock.Now().Sub(start), err)
	}
}

// timed runs one store call and reports its latency to the observer.
func (e *Engine) timed(op observe.StoreOp, call func() error) error {
	start := e.callStart(time.Time{})
	err := call()
	e.callEnd(op, start, err)
	return err
}

// holder is one call that holds a claim: everything its outcome writes
// need. For a call of Do it is part of the call's one allocation, with
// the flight, the operation's context and the first write's context.
type holder struct {
	call
	fence     uint64
	owner     string
	expiresAt int64
	lease     time.Duration
	flight    *flight // nil for a write through a Token
	fl        flight  // the flight this call leads, when it does
	flUsed    bool    // fl has led a flight already
	// from is the status the record must be in for the outcome write:
	// zero (IN_PROGRESS) but for a token read from a settled record.
	from store.Status
	// detached is set once the operation handed its claim off ([Detach]):
	// the engine then writes no outcome for it.
	detached atomic.Bool

	opCtx   opContext
	cancel  context.CancelCauseFunc // cancels opCtx; nil when it is not renewed
	wctx    writeCtx                // the first outcome write's context
	wctxUse bool

	// The outcome this holder wrote, for the flight's followers.
	wrote   store.Status
	result  []byte
	errRec  *store.ErrorRecord
	wroteAt int64

	// renewal state, guarded by Engine.renewals.mu
	renewOn  bool  // renewal wanted: started and not stopped
	renewing bool  // a renewal is in flight
	ended    bool  // the claim is gone or settled: never resume
	next     int64 // when the next renewal is due (Clock, UnixNano)
	qi       int   // index in the renewal queue; -1 when not queued
}

// opContext is the context an operation runs in: its caller's (made
// cancellable when the lease is renewed), carrying the [Claim] and the
// holder without a context per value.
type opContext struct {
	context.Context
	h *holder
}

// Value answers the claim and the holder, and asks the parent for the rest.
func (c *opContext) Value(key any) any {
	switch key.(type) {
	case claimCtxKey:
		return Claim{Key: c.h.key, Fence: c.h.fence, Owner: c.h.owner, e: c.h.e, trace: c.h.traceContext()}
	case holderKey:
		return c.h
	}
	return c.Context.Value(key)
}

// final is the record of what h wrote, for the flight's followers: nil
// when it wrote nothing.
func (h *holder) final() *store.Record {
	if h.wrote == 0 {
		return nil
	}
	return &store.Record{Key: h.key, Status: h.wrote, Fence: h.fence, Owner: h.owner, Fingerprint: h.fingerprint,
		Result: h.result, Err: h.errRec, ExpiresAt: h.wroteAt + h.e.cfg.Expiry.Milliseconds(), CompletedAt: h.wroteAt}
}

// execute runs op under the claim (taken at now) and records its outcome.
// The lease is renewed until the outcome is written (or the engine gives
// up on it), so that retried outcome writes never hand the key to a
// second execution.
func (h *holder) execute(ctx context.Context, now time.Time) (outcome, error) {
	e := h.e
	h.opCtx = opContext{Context: ctx, h: h}
	// A lease taken from the context's deadline already covers all the
	// operation can do: the context ends there. Renewing it would only keep
	// the key from a retry after a timed-out caller (a Lambda invocation)
	// was ended.
	if _, hasDeadline := ctx.Deadline(); e.cfg.RenewInterval > 0 && !hasDeadline {
		h.opCtx.Context, h.cancel = context.WithCancelCause(ctx)
		e.renewals.start(h, now)
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		// op panicked: release the claim so a retry can run, unless it
		// was handed off; the panic goes on up the stack.
		h.stopRenewal()
		if !h.detached.Load() {
			h.release(ctx)
		}
		e.land(h.key, h.flight, nil)
	}()
	res, opErr := h.op.runOp(&h.opCtx)
	finished = true
	if h.cancel != nil {
		h.cancel(nil)
	}
	defer h.stopRenewal()
	unrecorded, err := h.record(ctx, res, opErr)
	// Followers replay what was written, if anything (final).
	e.land(h.key, h.flight, h)
	return outcome{fence: h.fence, recorded: h.wrote, unrecorded: unrecorded}, err
}

// record writes the outcome of the operation (res, opErr) under the claim:
// nothing when it was handed off or is uncertain, a complete, a fail, or
// a release. unrecorded is the store's last answer when that write did not
// land; err is the call's error.
func (h *holder) record(ctx context.Context, res opResult, opErr error) (unrecorded, err error) {
	e := h.e
	switch {
	case h.detached.Load():
		// The claim was handed off: whoever holds its token settles it.
		h.observe(observe.OutcomeHandedOff)
		return nil, opErr
	case opErr == nil && res.selfRecorded:
		// The operation recorded its own success (DoCompleting).
		h.noteCompleted(res.result, store.Millis(e.cfg.Clock.Now()))
		if e.cache != nil {
			h.cachePut(res.value)
		}
		return nil, nil
	case opErr == nil:
		return h.complete(ctx, res.result, res.value), nil
	}
	var (
		encErr *encodeError
		term   *TerminalError
		unc    *UncertainError
	)
	switch {
	case errors.As(opErr, &encErr):
		return h.storeUnreplayable(ctx, "idem.result_encoding", encErr.Error(), -1), nil
	case errors.As(opErr, &term):
		return h.fail(ctx, term.record()), opErr
	case errors.As(opErr, &unc):
		// The effect is unknown: keep the claim until its lease ends, so
		// that no retry runs the operation again before then.
		h.observe(observe.OutcomeUncertain)
		e.cfg.Logger.Warn("idem: outcome uncertain; the claim is kept until its lease ends",
			"key", h.key, "fence", h.fence, "err", unc.Err)
		return nil, opErr
	default:
		// A claim being given up needs no renewal: a lapsed lease only
		// lets a retry in sooner.
		h.stopRenewal()
		return h.release(ctx), opErr
	}
}

// cachePut caches the COMPLETED record this holder wrote.
func (h *holder) cachePut(value any) {
	h.e.cache.put(h.key, h.fingerprint, h.result, value, h.wrote, h.wroteAt+h.e.cfg.Expiry.Milliseconds())
}

// complete records a success: COMPLETED, or the FAILED marker that
// replaced a result too large to store. It returns the store's last
// answer when nothing could be recorded (logged and counted already).
func (h *holder) complete(ctx context.Context, result []byte, value any) error {
	e := h.e
	if e.cfg.MaxResultBytes > 0 && len(result) > e.cfg.MaxResultBytes {
		return h.storeUnreplayable(ctx, CodeResultTooLarge,
			fmt.Sprintf("result of %d bytes is over the limit of %d", len(result), e.cfg.MaxResultBytes), e.cfg.MaxResultBytes)
	}
	err := h.write(ctx, writeReq{kind: writeComplete, result: result})
	if err != nil {
		if tl, ok := asTooLarge(err); ok {
			return h.storeUnreplayable(ctx, CodeResultTooLarge, err.Error(), tl.Limit)
		}
		h.writeFailed(observe.StoreComplete, err)
		return err
	}
	if e.cache != nil && h.flight != nil { // a token's write knows no fingerprint
		h.cachePut(value)
	}
	return nil
}

// asTooLarge returns err's *store.TooLargeError, if it has one.
func asTooLarge(err error) (*store.TooLargeError, bool) {
	var tl *store.TooLargeError
	ok := errors.As(err, &tl)
	return tl, ok
}

// noteCompleted notes that this claim's record is COMPLETED with result,
// as of now.
func (h *holder) noteCompleted(result []byte, now int64) {
	h.wrote, h.result, h.errRec, h.wroteAt = store.StatusCompleted, result, nil, now
}

// storeUnreplayable marks a successful call whose result cannot be stored
// as FAILED with code, so that retries get a clear error instead of running
// the operation a second time. The message is cut to fit limit (0: none).
func (h *holder) storeUnreplayable(ctx context.Context, code, msg string, limit int) error {
	e := h.e
	h.observe(observe.OutcomeCompleteFailed)
	e.cfg.Logger.Error("idem: operation succeeded but its result cannot be stored; retries will get an error",
		"key", h.key, "code", code, "reason", msg)
	return h.fail(ctx, boundedError(code, msg, limit))
}

// boundedError is a stored error whose size ([ErrorRecord.Size]) fits
// limit (negative: no limit): the message cut on a UTF-8 boundary, no body.
// The code is not counted against a store's limit, so the marker fits any
// limit, even 0.
func boundedError(code, msg string, limit int) store.ErrorRecord {
	if limit >= 0 && len(msg) > limit {
		msg = strings.ToValidUTF8(msg[:limit], "")
	}
	return store.ErrorRecord{Code: code, Message: msg}
}

// fail records a terminal error (FAILED), or returns the store's last
// answer when nothing could be recorded (logged and counted already). A
// terminal error too large for the store is replaced by a bounded marker
// with [CodeResultTooLarge], as a too-large result is: the key never stays
// IN_PROGRESS for a retry to run again.
func (h *holder) fail(ctx context.Context, er store.ErrorRecord) error {
	e := h.e
	err := h.write(ctx, writeReq{kind: writeFail, err: &er})
	if tl, ok := asTooLarge(err); ok {
		// Each fallback is strictly smaller than what was refused, so
		// this ends.
		marker := boundedError(CodeResultTooLarge,
			fmt.Sprintf("terminal error %q of %d bytes is over the store's limit of %d", er.Code, er.Size(), tl.Limit), tl.Limit)
		if marker.Size() < er.Size() {
			h.observe(observe.OutcomeCompleteFailed)
			e.cfg.Logger.Error("idem: terminal error too large to store; a bounded marker is stored instead",
				"key", h.key, "code", er.Code, "size", er.Size(), "limit", tl.Limit)
			return h.fail(ctx, marker)
		}
	}
	if err != nil {
		h.writeFailed(observe.StoreFail, err)
		return err
	}
	h.observe(observe.OutcomeFailed)
	return nil
}

// release deletes the claim so that a retry can run. A claim that is gone
// already (expired, reclaimed, released by an earlier attempt whose reply
// was lost) is released. The error is the store's last answer when the
// release failed (logged and counted already).
func (h *holder) release(ctx context.Context) error {
	err := h.write(ctx, writeReq{kind: writeRelease})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.writeFailed(observe.StoreRelease, err)
		return err
	}
	h.observe(observe.OutcomeReleased)
	return nil
}

// Outcome writes are retried with capped exponential backoff and jitter
// while Config.WriteTimeout lasts; each attempt gets at most a third of it.
const (
	writeBackoff    = 10 * time.Millisecond
	maxWriteBackoff = time.Second
)

// writeKind is one of the fenced writes a holder makes.
type writeKind uint8

const (
	writeComplete writeKind = iota
	writeFail
	writeRelease
	writeExtend
)

// writeReq is one fenced write of a holder: its kind, and what that kind
// writes.
type writeReq struct {
	kind   writeKind
	result []byte                      // writeComplete: the encoded value
	err    *store.ErrorRecord          // writeFail: the terminal error
	extend func(p *store.ExtendParams) // writeExtend: sets the new lease and reference
}

// settles is the status a landed complete or fail leaves the record in;
// zero for the writes that settle nothing.
func (k writeKind) settles() store.Status {
	switch k {
	case writeComplete:
		return store.StatusCompleted
	case writeFail:
		return store.StatusFailed
	}
	return 0
}

// write makes one fenced write, retrying a transient failure until it
// succeeds or Config.WriteTimeout has passed. Every write is fenced, so a
// retry is safe; a retry of a complete or fail that finds the record
// already settled as it asked, under this very claim, learns that an
// earlier attempt landed and its reply was lost: success. Tokens let other writers
// hold the same claim, so the stored outcome must be this write's (landed,
// read back) — else the refusal is returned. The writes go on when the
// caller's context is cancelled. A complete or fail that lands is noted
// on the holder (wrote, result, errRec, wroteAt).
func (h *holder) write(ctx context.Context, req writeReq) error {
	e := h.e
	now := e.cfg.Clock.Now()
	deadline := now.Add(e.cfg.WriteTimeout)
	backoff := writeBackoff
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			now = e.cfg.Clock.Now()
		}
		w := &h.wctx
		if h.wctxUse {
			w = new(writeCtx)
		}
		h.wctxUse = true
		w.init(ctx, e.realNow(now).Add(min(deadline.Sub(now), max(e.cfg.WriteTimeout/3, time.Millisecond))))
		err := h.try(w, &req, store.Millis(now))
		w.stop()
		switch {
		case err == nil:
			return nil
		case !transient(err):
			if fe, ok := asFenced(err); ok && fe.Own() && fe.Status != 0 && fe.Status == req.kind.settles() {
				if h.ownWrite(context.WithoutCancel(ctx), &req) {
					h.noteWrite(&req, store.Millis(now))
					return nil
				}
			}
			return err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if e.cfg.Clock.Now().Add(wait).After(deadline) {
			e.cfg.Logger.Error("idem: giving up on a store write after WriteTimeout",
				"key", h.key, "op", req.kind.op(), "attempts", attempt, "write_timeout", e.cfg.WriteTimeout, "err", err)
			return err
		}
		e.cfg.Observer.Observe(h.name, observe.OutcomeWriteRetried)
		h.event(observe.Event{Kind: observe.EventWriteRetry, Op: req.kind.op(), Attempt: attempt, Delay: wait, Err: err})
		e.cfg.Logger.Warn("idem: store write failed; retrying", "key", h.key, "op", req.kind.op(), "attempt", attempt, "err", err)
		<-e.cfg.Clock.After(wait)
		backoff = min(backoff*2, maxWriteBackoff)
	}
}

// try makes one attempt of a write at now (ms).
func (h *holder) try(ctx context.Context, req *writeReq, now int64) error {
	e := h.e
	start := e.callStart(time.Time{})
	ctx, ss := h.storeSpan(ctx, req.kind.op())
	ref := store.ClaimRef{Key: h.key, Fence: h.fence, Owner: h.owner, From: h.from, Now: now}
	var err error
	switch req.kind {
	case writeComplete:
		p := store.CompleteParams{ClaimRef: ref, ExpiresAt: now + e.cfg.Expiry.Milliseconds(), Result: req.result}
		if e.completer != nil {
			err = e.completer.complete(ctx, p)
		} else {
			err = e.store.Complete(ctx, p)
		}
	case writeFail:
		err = e.store.Fail(ctx, store.FailParams{ClaimRef: ref, ExpiresAt: now + e.cfg.Expiry.Milliseconds(), Err: *req.err})
	case writeRelease:
		err = e.store.Release(ctx, store.ReleaseParams{ClaimRef: ref})
	case writeExtend:
		ref.From = 0 // an Extend acts on an IN_PROGRESS claim only
		p := store.ExtendParams{ClaimRef: ref}
		req.extend(&p)
		err = e.store.Extend(ctx, p)
	}
	e.callEnd(req.kind.op(), start, err)
	endStore(ss, err)
	if err == nil {
		h.noteWrite(req, now)
	}
	return err
}

// noteWrite notes a complete or fail that landed at now.
func (h *holder) noteWrite(req *writeReq, now int64) {
	switch req.kind {
	case writeComplete:
		h.noteCompleted(req.result, now)
	case writeFail:
		h.wrote, h.result, h.errRec, h.wroteAt = store.StatusFailed, nil, req.err, now
	}
}

// op is the store operation a write makes, for the observer and errors.
func (k writeKind) op() observe.StoreOp {
	switch k {
	case writeComplete:
		return observe.StoreComplete
	case writeFail:
		return observe.StoreFail
	case writeRelease:
		return observe.StoreRelease
	}
	return observe.StoreExtend
}

// asFenced returns err's *store.FencedError, if it has one.
func asFenced(err error) (*store.FencedError, bool) {
	var fe *store.FencedError
	ok := errors.As(err, &fe)
	return fe, ok
}

// ownWrite decides whether a record found settled under this holder's
// claim was settled by this write (its reply lost) rather than by another
// holder of the claim's token.
// The record is read back: an earlier attempt, or an earlier call by the
// same worker whose reply was lost, left this write's outcome; another
// writer's outcome differs.
func (h *holder) ownWrite(ctx context.Context, req *writeReq) bool {
	var r *store.Record
	ctx, ss := h.storeSpan(ctx, observe.StoreGet)
	err := h.e.timed(observe.StoreGet, func() (err error) {
		r, err = h.e.store.Get(ctx, h.key)
		return err
	})
	endStore(ss, err)
	if err != nil {
		// Cannot tell: the claim is this holder's and the record settled
		// as it asked, which is what a lost reply looks like.
		return true
	}
	if req.kind == writeComplete {
		return bytes.Equal(r.Result, req.result)
	}
	er := req.err
	return r.Err != nil && r.Err.Code == er.Code && r.Err.Message == er.Message && bytes.Equal(r.Err.Body, er.Body)
}

// transient reports whether a failed store write may succeed if retried:
// anything but an answer about the record (not found, fenced out, too
// large, corrupt) or a refusal only a configuration change mends
// (store.ErrMisconfigured: credentials refused, a bucket gone).
func transient(err error) bool {
	return !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrFenced) &&
		!errors.Is(err, store.ErrTooLarge) && !errors.Is(err, store.ErrCorrupt) &&
		!errors.Is(err, store.ErrMisconfigured) && !errors.Is(err, store.ErrInvalidParams)
}

func (h *holder) writeFailed(op observe.StoreOp, err error) {
	e := h.e
	level := slog.LevelError
	if errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrNotFound) {
		h.observe(observe.OutcomeFenced)
		level = slog.LevelWarn
	} else {
		h.observe(observe.OutcomeStoreError)
	}
	if op == observe.StoreComplete {
		h.observe(observe.OutcomeCompleteFailed)
	}
	e.cfg.Logger.Log(context.Background(), level, "idem: store "+string(op)+" failed after the operation ran",
		"key", h.key, "fence", h.fence, "err", err)
}

// realNow returns now (from the engine's clock) on the real clock, for
// context deadlines, which package context keeps in real time.
func (e *Engine) realNow(now time.Time) time.Time {
	if e.sysClock {
		return now
	}
	return time.Now()
}

// writeCtx is the context of one outcome write: the caller's values, none
// of its cancellation, and a deadline. Its timer and channel are made only
// when the store asks for Done; a store that only reads the deadline (or
// nothing) pays for neither.
type writeCtx struct {
	parent   context.Context
	deadline time.Time

	mu     sync.Mutex
	values context.Context // context.WithoutCancel(parent), made by the first Value
	done   chan struct{}
	timer  *time.Timer
	err    error
}

func (w *writeCtx) init(parent context.Context, deadline time.Time) {
	w.parent, w.deadline = parent, deadline
}

// stop ends the write: its timer, if the store made one, is stopped.
func (w *writeCtx) stop() {
	w.mu.Lock()
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
}

// Deadline implements context.Context.
func (w *writeCtx) Deadline() (time.Time, bool) { return w.deadline, true }

// Done implements context.Context.
func (w *writeCtx) Done() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done == nil {
		w.done = make(chan struct{})
		if d := time.Until(w.deadline); d <= 0 {
			w.expireLocked()
		} else {
			w.timer = time.AfterFunc(d, w.expire)
		}
	}
	return w.done
}

func (w *writeCtx) expire() {
	w.mu.Lock()
	w.expireLocked()
	w.mu.Unlock()
}

func (w *writeCtx) expireLocked() {
	if w.err == nil {
		w.err = context.DeadlineExceeded
		close(w.done)
	}
}

// Err implements context.Context.
func (w *writeCtx) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done == nil && !time.Now().Before(w.deadline) {
		return context.DeadlineExceeded // no channel to close yet: nobody waits on it
	}
	return w.err
}

// Value implements context.Context: the parent's values, but not its
// cancellation (context.Cause must not see it).
func (w *writeCtx) Value(key any) any {
	w.mu.Lock()
	if w.values == nil {
		w.values = context.WithoutCancel(w.parent)
	}
	v := w.values
	w.mu.Unlock()
	return v.Value(key)
}

func (w *writeCtx) String() string { return "idem.writeContext" }
