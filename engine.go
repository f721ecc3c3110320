package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

	mu      sync.Mutex
	flights map[string]*flight
}

// New returns an engine over store. A nil cfg means all defaults. It fails
// with [ErrInvalidConfig] when a field is out of range, saying which.
func New(store store.Store, cfg *Config) (*Engine, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	e := &Engine{store: store, cfg: c, ownerPrefix: c.Owner + "/" + randomID(), flights: make(map[string]*flight)}
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
}

// Do runs fn at most once for the key that req names. See [DoIdentity].
func Do[T any](ctx context.Context, e *Engine, req Request, fn func(context.Context) (T, error)) (Result[T], error) {
	id, err := req.Identity()
	if err != nil {
		return Result[T]{}, err
	}
	return DoIdentity(ctx, e, id, fn)
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
// returned; the failure is logged and counted (OutcomeCompleteFailed).
func DoIdentity[T any](ctx context.Context, e *Engine, id Identity, fn func(context.Context) (T, error)) (Result[T], error) {
	return doTyped(ctx, e, id, false, func(ctx context.Context, _ *Completion[T]) (T, error) { return fn(ctx) })
}

// DoCompleting is [Do] for an operation that records its own success, in
// the same transaction as its own writes (pgstore.DoTx is built on it):
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
	return doTyped(ctx, e, id, true, fn)
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
	return store.CompleteParams{Key: c.claim.Key, Fence: c.claim.Fence, Owner: c.claim.Owner, Now: now,
		ExpiresAt: now + c.e.cfg.Expiry.Milliseconds(), Result: b}, nil
}

// doTyped is the typed layer of every call; completing says whether fn may
// record its own success (DoCompleting), so that a plain Do pays nothing
// for it.
func doTyped[T any](ctx context.Context, e *Engine, id Identity, completing bool, fn func(context.Context, *Completion[T]) (T, error)) (Result[T], error) {
	var (
		res Result[T]
		ran bool
	)
	c := &call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.Fingerprint}
	res.StoreKey = c.key
	if e.cfg.Disabled {
		e.cfg.Observer.Observe(c.name, OutcomeUnprotected)
		v, err := fn(context.WithValue(ctx, disabledKey{}, id.StoreKey), &Completion[T]{e: e})
		res.Value = v
		return res, err
	}
	keep := e.cache != nil && cacheable[T]()
	c.op = func(ctx context.Context) (opResult, error) {
		var comp *Completion[T]
		if completing {
			claim, _ := FromContext(ctx)
			comp = &Completion[T]{e: e, claim: claim}
		}
		v, err := fn(ctx, comp)
		res.Value, ran = v, true
		if err != nil {
			return opResult{}, err
		}
		var out opResult
		if comp != nil && comp.result != nil {
			out.result, out.settled = comp.result, true
		}
		if !out.settled {
			if out.result, err = e.cfg.Codec.Marshal(v); err != nil {
				return opResult{}, &encodeError{err}
			}
		}
		if keep {
			out.value = v
		}
		return out, nil
	}
	out, err := c.run(ctx)
	if err != nil && !ran && e.cfg.FailOpen && isClaimFailure(err) {
		e.cfg.Observer.Observe(c.name, OutcomeUnprotected)
		e.cfg.Logger.Warn("idem: store failed; running the operation UNPROTECTED because FailOpen is set",
			"key", c.key, "err", err)
		v, ferr := fn(ctx, &Completion[T]{e: e})
		res.Value = v
		return res, ferr
	}
	res.Replayed, res.Fence, res.Recorded = out.replayed, out.fence, out.recorded
	if v, ok := out.value.(T); ok && !ran {
		res.Value = v
	} else if !ran && out.result != nil {
		if uerr := e.cfg.Codec.Unmarshal(out.result, &res.Value); uerr != nil {
			return res, &store.CorruptError{Key: c.key, Reason: fmt.Sprintf("stored result does not decode into %T: %v", res.Value, uerr)}
		}
	}
	return res, err
}

// opResult is what the operation hands back to the engine.
type opResult struct {
	result  []byte // the encoded value
	value   any    // the value itself, when the local cache may keep it (see cacheable)
	settled bool   // the operation recorded its own success ([DoCompleting])
}

// opFunc runs the operation.
type opFunc func(context.Context) (opResult, error)

type encodeError struct{ err error }

func (e *encodeError) Error() string { return "idem: result cannot be encoded: " + e.err.Error() }
func (e *encodeError) Unwrap() error { return e.err }

func isClaimFailure(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Op == StoreClaim
}

// outcome is what run hands back to the typed layer.
type outcome struct {
	replayed bool
	result   []byte       // encoded value to decode, on a replay
	value    any          // the value itself, from the local cache
	fence    uint64       // fence held while running, when this call ran fn
	recorded store.Status // the status the outcome write left, when it landed
}

// call is one call through the engine, before it holds a claim: what every
// step needs, derived once.
type call struct {
	e           *Engine
	key         string // the store key
	name        string // the operation's name (the key's scope), for the Observer
	fingerprint string
	op          opFunc
}

// flight lets concurrent duplicates inside one process share one claim.
type flight struct {
	claimed  chan struct{} // closed once the leader's claim has answered
	claimRec *store.Record
	acquired bool
	claimErr error
	// leaseUntil is the claim's lease as last written, renewals included.
	leaseUntil atomic.Int64

	done  chan struct{} // closed once the leader has finished
	final *store.Record // COMPLETED or FAILED outcome, nil when released
	// ref is the execution reference the leader attached when it handed
	// its claim off ([Detach]), for the followers' InProgressError.
	ref atomic.Pointer[string]
}

// join returns the in-process flight for key, creating it (leader = true)
// when there is none.
func (e *Engine) join(key string) (f *flight, leader bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f, ok := e.flights[key]; ok {
		return f, false
	}
	f = &flight{claimed: make(chan struct{}), done: make(chan struct{})}
	e.flights[key] = f
	return f, true
}

// land ends a flight: later callers start their own.
func (e *Engine) land(key string, f *flight, final *store.Record) {
	e.mu.Lock()
	delete(e.flights, key)
	e.mu.Unlock()
	f.final = final
	close(f.done)
}

// mismatch checks the call's fingerprint against a stored one: the one
// check of every path (cache, store conflict, in-process flight).
func (c *call) mismatch(stored string) error {
	if stored == c.fingerprint {
		return nil
	}
	c.e.cfg.Observer.Observe(c.name, OutcomeMismatch)
	return &MismatchError{Key: c.key, Stored: stored, Got: c.fingerprint}
}

func (c *call) run(ctx context.Context) (outcome, error) {
	e := c.e
	if e.cache != nil {
		if ent, ok := e.cache.get(c.key, store.Millis(e.cfg.Clock.Now())); ok {
			if err := c.mismatch(ent.fingerprint); err != nil {
				return outcome{}, err
			}
			e.cfg.Observer.Observe(c.name, OutcomeCacheHit)
			return outcome{replayed: true, result: ent.result, value: ent.value}, nil
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
		if f, leader := e.join(c.key); leader {
			out, err = c.lead(ctx, f)
		} else {
			out, retry, err = c.follow(ctx, f, deadline)
			if retry {
				continue
			}
		}
		var ipe *InProgressError
		// Work handed elsewhere (a reference is attached) runs for its
		// expected completion, not for a wait's worth: answer at once.
		if errors.As(err, &ipe) && e.cfg.Wait > 0 && ipe.Ref == "" {
			if werr := e.pause(ctx, deadline, &backoff); werr == nil {
				continue
			} else if !errors.Is(werr, ErrInProgress) {
				return outcome{}, werr
			}
		}
		if ipe != nil {
			e.cfg.Observer.Observe(c.name, OutcomeInProgress)
		}
		return out, err
	}
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
	select {
	case <-f.claimed:
	case <-ctx.Done():
		return outcome{}, false, ctx.Err()
	}
	if f.claimErr != nil {
		return outcome{}, false, f.claimErr
	}
	if !f.acquired {
		out, err := c.existing(f.claimRec)
		return out, false, err
	}
	rec := f.claimRec
	if err := c.mismatch(rec.Fingerprint); err != nil {
		return outcome{}, false, err
	}
	// The lease as last renewed; while the leader writes the outcome it may
	// have run out in this process's view, but the key is still held.
	until := store.FromMillis(max(f.leaseUntil.Load(), store.Millis(e.cfg.Clock.Now())))
	busy := &InProgressError{Key: c.key, LeaseUntil: until, Owner: rec.Owner}
	if ref := f.ref.Load(); ref != nil {
		busy.Ref = *ref
	}
	if e.cfg.Wait == 0 || busy.Ref != "" { // handed-off work: no wait
		return outcome{}, false, busy
	}
	var timeout <-chan time.Time
	if d := deadline.Sub(e.cfg.Clock.Now()); d > 0 {
		timeout = e.cfg.Clock.After(d)
	} else {
		return outcome{}, false, busy
	}
	select {
	case <-f.done:
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
		c.e.cfg.Observer.Observe(c.name, OutcomeReplayed)
		if c.e.cache != nil {
			c.e.cache.put(rec, nil)
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
// A label given with [WithLockedBy] ends it, after another '/'.
func (e *Engine) owner(ctx context.Context) string {
	var b [24]byte
	seq := strconv.AppendUint(b[:0], e.seq.Add(1), 10)
	by, _ := ctx.Value(lockedByKey{}).(string)
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
func (c *call) lead(ctx context.Context, f *flight) (outcome, error) {
	e := c.e
	now := e.cfg.Clock.Now()
	lease := e.cfg.Lease
	if dl, ok := ctx.Deadline(); ok {
		lease = dl.Sub(now)
	}
	if err := ctx.Err(); err != nil || lease <= 0 {
		if err == nil {
			err = context.DeadlineExceeded
		}
		f.claimErr = err
		close(f.claimed)
		e.land(c.key, f, nil)
		return outcome{}, err
	}
	lease = min(lease, e.cfg.Expiry)
	res, err := c.claim(ctx, now, lease, true)
	if err != nil {
		f.claimErr = err
		close(f.claimed)
		e.land(c.key, f, nil)
		return outcome{}, f.claimErr
	}
	f.claimRec, f.acquired = res.Record, res.Acquired
	f.leaseUntil.Store(res.Record.LeaseUntil)
	close(f.claimed)
	if !res.Acquired {
		e.land(c.key, f, nil)
		return c.existing(res.Record)
	}
	e.cfg.Observer.Observe(c.name, OutcomeAcquired)
	if res.Takeover {
		e.cfg.Observer.Observe(c.name, OutcomeTakeover)
		e.cfg.Logger.Info("idem: took over a claim whose lease had passed", "key", c.key, "fence", res.Record.Fence)
	}
	h := &holder{call: c, fence: res.Record.Fence, owner: res.Record.Owner, expiresAt: res.Record.ExpiresAt, lease: lease, flight: f}
	return h.execute(ctx)
}

// claim makes the store's Claim of the call's key at now, with lease: the
// one claim of Do and Begin. local says this process holds the claim (Do),
// rather than a token handed out (Begin). A store failure is counted and
// returned as a [*StoreError].
func (c *call) claim(ctx context.Context, now time.Time, lease time.Duration, local bool) (store.ClaimResult, error) {
	e := c.e
	nowMs := store.Millis(now)
	p := store.ClaimParams{
		Key:         c.key,
		Fingerprint: c.fingerprint,
		Owner:       e.owner(ctx),
		Now:         nowMs,
		LeaseUntil:  nowMs + max(lease.Milliseconds(), 1),
		ExpiresAt:   nowMs + e.cfg.Expiry.Milliseconds(),
		Local:       local,
	}
	var res store.ClaimResult
	err := e.timed(StoreClaim, func() (err error) {
		res, err = e.store.Claim(ctx, p)
		return err
	})
	if err == nil && res.Record == nil {
		err = &store.CorruptError{Key: c.key, Reason: "store answered a claim with no record"}
	}
	if err != nil {
		e.cfg.Observer.Observe(c.name, OutcomeStoreError)
		return store.ClaimResult{}, &StoreError{Op: StoreClaim, Key: c.key, Err: err}
	}
	return res, nil
}

// timed runs one store call and reports its latency to the Observer.
func (e *Engine) timed(op StoreOp, call func() error) error {
	start := e.cfg.Clock.Now()
	err := call()
	e.cfg.Observer.StoreCall(op, e.cfg.Clock.Now().Sub(start), err)
	return err
}

// holder is one call that holds a claim: everything its outcome writes
// need.
type holder struct {
	*call
	fence     uint64
	owner     string
	expiresAt int64
	lease     time.Duration
	flight    *flight // nil for a write through a Token
	renew     *renewer
	// from is the status the record must be in for the outcome write:
	// zero (IN_PROGRESS) but for a token read from a settled record.
	from store.Status
	// detached is set once the operation handed its claim off ([Detach]):
	// the engine then writes no outcome for it.
	detached atomic.Bool
}

// execute runs op under the claim and records its outcome. The lease is
// renewed until the outcome is written (or the engine gives up on it), so
// that retried outcome writes never hand the key to a second execution.
func (h *holder) execute(ctx context.Context) (outcome, error) {
	e := h.e
	opCtx, cancel := context.WithCancelCause(ctx)
	opCtx = NewContext(opCtx, Claim{Key: h.key, Fence: h.fence, Owner: h.owner})
	opCtx = context.WithValue(opCtx, holderKey{}, h)
	// A lease taken from the context's deadline already covers all the
	// operation can do: the context ends there. Renewing it would only keep
	// the key from a retry after a timed-out caller (a Lambda invocation)
	// was ended.
	if _, hasDeadline := ctx.Deadline(); e.cfg.RenewInterval > 0 && !hasDeadline {
		h.renew = &renewer{h: h, cancel: cancel}
		h.renew.start()
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		// op panicked: release the claim so a retry can run, unless it
		// was handed off; the panic goes on up the stack.
		cancel(nil)
		h.renew.stop()
		if !h.detached.Load() {
			h.release(ctx)
		}
		e.land(h.key, h.flight, nil)
	}()
	res, opErr := h.op(opCtx)
	finished = true
	cancel(nil)
	defer h.renew.stop()
	out := outcome{fence: h.fence}

	var encErr *encodeError
	var term *TerminalError
	var unc *UncertainError
	switch {
	case h.detached.Load():
		// The claim was handed off: whoever holds its token settles it.
		e.cfg.Observer.Observe(h.name, OutcomeHandedOff)
		e.land(h.key, h.flight, nil)
		return out, opErr
	case errors.As(opErr, &encErr):
		if marker, _ := h.storeUnreplayable(ctx, "idem.result_encoding", encErr.Error(), -1); marker != nil {
			out.recorded = marker.Status
		}
		e.land(h.key, h.flight, nil)
		return out, nil
	case opErr == nil && res.settled:
		// The operation recorded its own success (DoCompleting).
		done := h.settled(res.result, store.Millis(e.cfg.Clock.Now()))
		if e.cache != nil {
			e.cache.put(done, res.value)
		}
		out.recorded = done.Status
		e.land(h.key, h.flight, done)
		return out, nil
	case opErr == nil:
		done, _ := h.complete(ctx, res.result, res.value)
		if done != nil {
			out.recorded = done.Status
		}
		e.land(h.key, h.flight, done)
		return out, nil
	case errors.As(opErr, &term):
		final, _ := h.fail(ctx, term.record())
		if final != nil {
			out.recorded = final.Status
		}
		e.land(h.key, h.flight, final)
		return out, opErr
	case errors.As(opErr, &unc):
		// The effect is unknown: keep the claim until its lease ends, so
		// that no retry runs the operation again before then.
		e.cfg.Observer.Observe(h.name, OutcomeUncertain)
		e.cfg.Logger.Warn("idem: outcome uncertain; the claim is kept until its lease ends",
			"key", h.key, "fence", h.fence, "err", unc.Err)
		e.land(h.key, h.flight, nil)
		return out, opErr
	default:
		// A claim being given up needs no renewal: a lapsed lease only
		// lets a retry in sooner.
		h.renew.stop()
		h.release(ctx)
		e.land(h.key, h.flight, nil)
		return out, opErr
	}
}

// complete records a success and returns the record the flight's
// followers replay: the COMPLETED one, the FAILED marker that replaced a
// result too large to store, or nil and the store's last answer when
// nothing could be recorded (logged and counted already).
func (h *holder) complete(ctx context.Context, result []byte, value any) (*store.Record, error) {
	e := h.e
	if e.cfg.MaxResultBytes > 0 && len(result) > e.cfg.MaxResultBytes {
		return h.storeUnreplayable(ctx, CodeResultTooLarge,
			fmt.Sprintf("result of %d bytes is over the limit of %d", len(result), e.cfg.MaxResultBytes), e.cfg.MaxResultBytes)
	}
	var done *store.Record
	same := func(r *store.Record) bool { return bytes.Equal(r.Result, result) }
	err := h.write(ctx, StoreComplete, store.StatusCompleted, same, func(wctx context.Context, now int64) error {
		done = h.settled(result, now)
		return e.store.Complete(wctx, store.CompleteParams{Key: h.key, Fence: h.fence, Owner: h.owner, Now: now, ExpiresAt: done.ExpiresAt, Result: result, From: h.from})
	})
	var tl *store.TooLargeError
	if errors.As(err, &tl) {
		return h.storeUnreplayable(ctx, CodeResultTooLarge, err.Error(), tl.Limit)
	}
	if err != nil {
		h.writeFailed(StoreComplete, err)
		return nil, err
	}
	if e.cache != nil && h.flight != nil { // a token's write knows no fingerprint
		e.cache.put(done, value)
	}
	return done, nil
}

// settled is the COMPLETED record of this claim with result, as of now.
func (h *holder) settled(result []byte, now int64) *store.Record {
	return &store.Record{Key: h.key, Status: store.StatusCompleted, Fence: h.fence, Owner: h.owner, Fingerprint: h.fingerprint,
		Result: result, ExpiresAt: now + h.e.cfg.Expiry.Milliseconds(), CompletedAt: now}
}

// storeUnreplayable marks a successful call whose result cannot be stored
// as FAILED with code, so that retries get a clear error instead of running
// the operation a second time. The message is cut to fit limit (0: none).
func (h *holder) storeUnreplayable(ctx context.Context, code, msg string, limit int) (*store.Record, error) {
	e := h.e
	e.cfg.Observer.Observe(h.name, OutcomeCompleteFailed)
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

// fail records a terminal error and returns the FAILED record the flight's
// followers replay, or nil and the store's last answer when nothing could
// be recorded (logged and counted already). A terminal error
// too large for the store is replaced by a bounded marker with
// [CodeResultTooLarge], as a too-large result is: the key never stays
// IN_PROGRESS for a retry to run again.
func (h *holder) fail(ctx context.Context, er store.ErrorRecord) (*store.Record, error) {
	e := h.e
	var final *store.Record
	same := func(r *store.Record) bool {
		return r.Err != nil && r.Err.Code == er.Code && r.Err.Message == er.Message && bytes.Equal(r.Err.Body, er.Body)
	}
	err := h.write(ctx, StoreFail, store.StatusFailed, same, func(wctx context.Context, now int64) error {
		final = &store.Record{Key: h.key, Status: store.StatusFailed, Fence: h.fence, Owner: h.owner, Fingerprint: h.fingerprint,
			Err: &er, ExpiresAt: now + e.cfg.Expiry.Milliseconds(), CompletedAt: now}
		return e.store.Fail(wctx, store.FailParams{Key: h.key, Fence: h.fence, Owner: h.owner, Now: now, ExpiresAt: final.ExpiresAt, Err: er, From: h.from})
	})
	var tl *store.TooLargeError
	if errors.As(err, &tl) {
		// Each fallback is strictly smaller than what was refused, so
		// this ends.
		marker := boundedError(CodeResultTooLarge,
			fmt.Sprintf("terminal error %q of %d bytes is over the store's limit of %d", er.Code, er.Size(), tl.Limit), tl.Limit)
		if marker.Size() < er.Size() {
			e.cfg.Observer.Observe(h.name, OutcomeCompleteFailed)
			e.cfg.Logger.Error("idem: terminal error too large to store; a bounded marker is stored instead",
				"key", h.key, "code", er.Code, "size", er.Size(), "limit", tl.Limit)
			return h.fail(ctx, marker)
		}
	}
	if err != nil {
		h.writeFailed(StoreFail, err)
		return nil, err
	}
	e.cfg.Observer.Observe(h.name, OutcomeFailed)
	return final, nil
}

// release deletes the claim so that a retry can run. A claim that is gone
// already (expired, reclaimed, released by an earlier attempt whose reply
// was lost) is released. The error is the store's last answer when the
// release failed (logged and counted already).
func (h *holder) release(ctx context.Context) error {
	e := h.e
	err := h.write(ctx, StoreRelease, 0, nil, func(wctx context.Context, now int64) error {
		return e.store.Release(wctx, store.ReleaseParams{Key: h.key, Fence: h.fence, Owner: h.owner, Now: now, From: h.from})
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		h.writeFailed(StoreRelease, err)
		return err
	}
	e.cfg.Observer.Observe(h.name, OutcomeReleased)
	return nil
}

// Outcome writes are retried with capped exponential backoff and jitter
// while Config.WriteTimeout lasts; each attempt gets at most a third of it.
const (
	writeBackoff    = 10 * time.Millisecond
	maxWriteBackoff = time.Second
)

// write makes one outcome write (complete, fail or release), retrying a
// transient failure until it succeeds or Config.WriteTimeout has passed.
// Every write is fenced, so a retry is safe; a retry that finds the
// record already settled (status settled) under this very claim learns
// that an earlier attempt landed and its reply was lost: success. Tokens
// let other writers hold the same claim, so the stored outcome must be
// this write's (landed, read back) — else the refusal is returned. The
// writes go on when the caller's context is cancelled.
func (h *holder) write(ctx context.Context, op StoreOp, settled store.Status, landed func(*store.Record) bool, try func(ctx context.Context, now int64) error) error {
	e := h.e
	ctx = context.WithoutCancel(ctx)
	deadline := e.cfg.Clock.Now().Add(e.cfg.WriteTimeout)
	backoff := writeBackoff
	for attempt := 1; ; attempt++ {
		now := e.cfg.Clock.Now()
		actx, cancel := context.WithTimeout(ctx, min(deadline.Sub(now), max(e.cfg.WriteTimeout/3, time.Millisecond)))
		err := e.timed(op, func() error { return try(actx, store.Millis(now)) })
		cancel()
		var fe *store.FencedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &fe) && fe.Own() && fe.Status == settled:
			if h.ownWrite(ctx, landed) {
				return nil
			}
			return err
		case !transient(err):
			return err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if e.cfg.Clock.Now().Add(wait).After(deadline) {
			e.cfg.Logger.Error("idem: giving up on a store write after WriteTimeout",
				"key", h.key, "op", op, "attempts", attempt, "write_timeout", e.cfg.WriteTimeout, "err", err)
			return err
		}
		e.cfg.Observer.Observe(h.name, OutcomeWriteRetried)
		e.cfg.Logger.Warn("idem: store write failed; retrying", "key", h.key, "op", op, "attempt", attempt, "err", err)
		<-e.cfg.Clock.After(wait)
		backoff = min(backoff*2, maxWriteBackoff)
	}
}

// ownWrite decides whether a record found settled under this holder's
// claim was settled by this write (its reply lost) rather than by another
// holder of the claim's token.
// The record is read back: an earlier attempt, or an earlier call by the
// same worker whose reply was lost, left this write's outcome; another
// writer's outcome differs.
func (h *holder) ownWrite(ctx context.Context, landed func(*store.Record) bool) bool {
	if landed == nil {
		return true
	}
	var r *store.Record
	err := h.e.timed(StoreGet, func() (err error) {
		r, err = h.e.store.Get(ctx, h.key)
		return err
	})
	if err != nil {
		// Cannot tell: the claim is this holder's and the record settled
		// as it asked, which is what a lost reply looks like.
		return true
	}
	return landed(r)
}

// transient reports whether a failed store write may succeed if retried:
// anything but an answer about the record (not found, fenced out, too
// large, corrupt).
func transient(err error) bool {
	return !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrFenced) &&
		!errors.Is(err, store.ErrTooLarge) && !errors.Is(err, store.ErrCorrupt)
}

func (h *holder) writeFailed(op StoreOp, err error) {
	e := h.e
	level := slog.LevelError
	if errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrNotFound) {
		e.cfg.Observer.Observe(h.name, OutcomeFenced)
		level = slog.LevelWarn
	} else {
		e.cfg.Observer.Observe(h.name, OutcomeStoreError)
	}
	if op == StoreComplete {
		e.cfg.Observer.Observe(h.name, OutcomeCompleteFailed)
	}
	e.cfg.Logger.Log(context.Background(), level, "idem: store "+string(op)+" failed after the operation ran",
		"key", h.key, "fence", h.fence, "err", err)
}

// renewer extends the lease while an operation runs and while its outcome
// is being written.
type renewer struct {
	h      *holder
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	stopped bool
	ended   bool // the claim is gone or settled: never resume
	timer   Timer
}

func (r *renewer) start() {
	r.mu.Lock()
	r.timer = r.h.e.cfg.Clock.AfterFunc(r.interval(), r.fire)
	r.mu.Unlock()
}

func (r *renewer) interval() time.Duration {
	return min(r.h.e.cfg.RenewInterval, max(r.h.lease/3, time.Millisecond))
}

func (r *renewer) fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	h := r.h
	e := h.e
	now := store.Millis(e.cfg.Clock.Now())
	until := min(now+max(h.lease.Milliseconds(), 1), h.expiresAt)
	// One renewal may take at most half an interval, and a failed one is
	// tried again after a quarter: a reply that never comes, or a short
	// outage, must not let the lease lapse while the work runs (with the
	// default interval of a third of the lease, three attempts fit in it).
	ctx, cancel := context.WithTimeout(context.Background(), min(e.cfg.WriteTimeout, max(r.interval()/2, time.Millisecond)))
	err := e.timed(StoreExtend, func() error {
		return e.store.Extend(ctx, store.ExtendParams{Key: h.key, Fence: h.fence, Owner: h.owner, Now: now, LeaseUntil: until})
	})
	cancel()
	next := r.interval()
	var fe *store.FencedError
	switch {
	case err == nil:
		h.flight.leaseUntil.Store(until)
	case errors.As(err, &fe) && fe.Own():
		// The outcome write landed before its reply came back: nothing
		// is left to renew.
		r.stopped, r.ended = true, true
		return
	case errors.Is(err, store.ErrFenced) || errors.Is(err, store.ErrNotFound):
		e.cfg.Observer.Observe(h.name, OutcomeFenced)
		e.cfg.Logger.Error("idem: lease renewal refused; the key was taken over, cancelling the operation",
			"key", h.key, "fence", h.fence, "err", err)
		r.stopped, r.ended = true, true
		r.cancel(ErrLeaseLost)
		return
	default:
		e.cfg.Observer.Observe(h.name, OutcomeStoreError)
		e.cfg.Logger.Warn("idem: lease renewal failed; will retry", "key", h.key, "err", err)
		next = max(r.interval()/4, time.Millisecond)
	}
	if until >= h.expiresAt {
		return // the claim cannot outlive its expiry
	}
	r.timer = e.cfg.Clock.AfterFunc(next, r.fire)
}

// resume restarts renewal after stop (a Detach whose write failed), unless
// the claim was lost or settled meanwhile. Safe on nil.
func (r *renewer) resume() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || !r.stopped {
		return
	}
	r.stopped = false
	r.timer = r.h.e.cfg.Clock.AfterFunc(r.interval(), r.fire)
}

// stop ends renewal, waiting for a renewal in flight. Safe on nil.
func (r *renewer) stop() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.stopped = true
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
}
