package idem

import (
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
)

// Engine runs operations at most once per key. It is safe for concurrent
// use; create one per store and share it.
type Engine struct {
	store Store
	cfg   Config
	cache *lru
	seq   atomic.Uint64

	mu      sync.Mutex
	flights map[string]*flight
}

// New returns an engine over store. A nil cfg means all defaults. It fails
// with [ErrInvalidConfig] when a field is out of range, saying which.
func New(store Store, cfg *Config) (*Engine, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	e := &Engine{store: store, cfg: c, flights: make(map[string]*flight)}
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
func (e *Engine) Store() Store { return e.store }

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
	// Key is the store key of the call.
	Key string
	// Fence is the fence under which this call ran the operation, 0 on a
	// replay.
	Fence uint64
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
	var (
		res Result[T]
		ran bool
	)
	if e.cfg.Disabled {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeUnprotected)
		v, err := fn(ctx)
		res.Value = v
		return res, err
	}
	keep := e.cache != nil && cacheable[T]()
	op := func(ctx context.Context) ([]byte, any, error) {
		v, err := fn(ctx)
		res.Value, ran = v, true
		if err != nil {
			return nil, nil, err
		}
		b, err := e.cfg.Codec.Marshal(v)
		if err != nil {
			return nil, nil, &encodeError{err}
		}
		if keep {
			return b, v, nil
		}
		return b, nil, nil
	}
	key := id.Key.String()
	res.Key = key
	out, err := e.run(ctx, key, id, op)
	if err != nil && !ran && e.cfg.FailOpen && isClaimFailure(err) {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeUnprotected)
		e.cfg.Logger.Warn("idem: store failed; running the operation UNPROTECTED because FailOpen is set",
			"key", key, "err", err)
		v, ferr := fn(ctx)
		res.Value = v
		return res, ferr
	}
	res.Replayed, res.Fence = out.replayed, out.fence
	if v, ok := out.value.(T); ok && !ran {
		res.Value = v
	} else if !ran && out.result != nil {
		if uerr := e.cfg.Codec.Unmarshal(out.result, &res.Value); uerr != nil {
			return res, &CorruptError{Key: key, Reason: fmt.Sprintf("stored result does not decode into %T: %v", res.Value, uerr)}
		}
	}
	return res, err
}

// opFunc runs the operation and returns its encoded result, and the value
// itself when the local cache may keep it (see cacheable).
type opFunc func(context.Context) (result []byte, value any, err error)

type encodeError struct{ err error }

func (e *encodeError) Error() string { return "idem: result cannot be encoded: " + e.err.Error() }
func (e *encodeError) Unwrap() error { return e.err }

func isClaimFailure(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Op == "claim"
}

// outcome is what run hands back to the typed layer.
type outcome struct {
	replayed bool
	result   []byte // encoded value to decode, on a replay
	value    any    // the value itself, from the local cache
	fence    uint64 // fence held while running, when this call ran fn
}

// flight lets concurrent duplicates inside one process share one claim.
type flight struct {
	claimed  chan struct{} // closed once the leader's claim has answered
	claimRec *Record
	acquired bool
	claimErr error

	done  chan struct{} // closed once the leader has finished
	final *Record       // COMPLETED or FAILED outcome, nil when released
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
func (e *Engine) land(key string, f *flight, final *Record) {
	e.mu.Lock()
	delete(e.flights, key)
	e.mu.Unlock()
	f.final = final
	close(f.done)
}

func (e *Engine) run(ctx context.Context, key string, id Identity, op opFunc) (outcome, error) {
	scope := id.Key.Name
	if e.cache != nil {
		if ent, ok := e.cache.get(key, Millis(e.cfg.Clock.Now())); ok {
			if ent.fingerprint != id.Fingerprint {
				e.cfg.Observer.Observe(scope, OutcomeMismatch)
				return outcome{}, &MismatchError{Key: key, Stored: ent.fingerprint, Got: id.Fingerprint}
			}
			e.cfg.Observer.Observe(scope, OutcomeCacheHit)
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
		if f, leader := e.join(key); leader {
			out, err = e.lead(ctx, f, key, id, op)
		} else {
			out, err, retry = e.follow(ctx, f, key, id, deadline)
			if retry {
				continue
			}
		}
		var ipe *InProgressError
		if errors.As(err, &ipe) && e.cfg.Wait > 0 {
			if werr := e.pause(ctx, deadline, &backoff); werr == nil {
				continue
			} else if !errors.Is(werr, ErrInProgress) {
				return outcome{}, werr
			}
		}
		if ipe != nil {
			e.cfg.Observer.Observe(scope, OutcomeInProgress)
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
func (e *Engine) follow(ctx context.Context, f *flight, key string, id Identity, deadline time.Time) (outcome, error, bool) {
	select {
	case <-f.claimed:
	case <-ctx.Done():
		return outcome{}, ctx.Err(), false
	}
	if f.claimErr != nil {
		return outcome{}, f.claimErr, false
	}
	if !f.acquired {
		out, err := e.existing(key, id, f.claimRec)
		return out, err, false
	}
	rec := f.claimRec
	if rec.Fingerprint != id.Fingerprint {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeMismatch)
		return outcome{}, &MismatchError{Key: key, Stored: rec.Fingerprint, Got: id.Fingerprint}, false
	}
	busy := &InProgressError{Key: key, LeaseUntil: FromMillis(rec.LeaseUntil), Owner: rec.Owner}
	if e.cfg.Wait == 0 {
		return outcome{}, busy, false
	}
	var timeout <-chan time.Time
	if d := deadline.Sub(e.cfg.Clock.Now()); d > 0 {
		timeout = e.cfg.Clock.After(d)
	} else {
		return outcome{}, busy, false
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return outcome{}, ctx.Err(), false
	case <-timeout:
		return outcome{}, busy, false
	}
	if f.final == nil {
		return outcome{}, nil, true
	}
	out, err := e.replay(key, f.final)
	return out, err, false
}

// existing answers a call from a live record held by someone else.
func (e *Engine) existing(key string, id Identity, rec *Record) (outcome, error) {
	if rec.Fingerprint != id.Fingerprint {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeMismatch)
		return outcome{}, &MismatchError{Key: key, Stored: rec.Fingerprint, Got: id.Fingerprint}
	}
	switch rec.Status {
	case StatusCompleted, StatusFailed:
		e.cfg.Observer.Observe(id.Key.Name, OutcomeReplayed)
		if e.cache != nil {
			e.cache.put(rec, nil)
		}
		return e.replay(key, rec)
	case StatusInProgress:
		return outcome{}, &InProgressError{Key: key, LeaseUntil: FromMillis(rec.LeaseUntil), Owner: rec.Owner}
	}
	return outcome{}, &CorruptError{Key: key, Reason: "record has invalid status " + rec.Status.String()}
}

func (e *Engine) replay(key string, rec *Record) (outcome, error) {
	switch rec.Status {
	case StatusCompleted:
		return outcome{replayed: true, result: rec.Result}, nil
	case StatusFailed:
		return outcome{replayed: true}, terminalFromRecord(rec.Err)
	}
	return outcome{}, &CorruptError{Key: key, Reason: "replay of a record in status " + rec.Status.String()}
}

// owner returns a claim owner unique to this call: the configured owner
// and a sequence number.
func (e *Engine) owner() string {
	var b [24]byte
	seq := strconv.AppendUint(b[:0], e.seq.Add(1), 10)
	var sb strings.Builder
	sb.Grow(len(e.cfg.Owner) + 1 + len(seq))
	sb.WriteString(e.cfg.Owner)
	sb.WriteByte('/')
	sb.Write(seq)
	return sb.String()
}

// lead claims the key for this call and, when acquired, runs the operation.
func (e *Engine) lead(ctx context.Context, f *flight, key string, id Identity, op opFunc) (outcome, error) {
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
		e.land(key, f, nil)
		return outcome{}, err
	}
	lease = min(lease, e.cfg.Expiry)
	nowMs := Millis(now)
	p := ClaimParams{
		Key:         key,
		Fingerprint: id.Fingerprint,
		Owner:       e.owner(),
		Now:         nowMs,
		LeaseUntil:  nowMs + max(lease.Milliseconds(), 1),
		ExpiresAt:   nowMs + e.cfg.Expiry.Milliseconds(),
	}
	start := e.cfg.Clock.Now()
	res, err := e.store.Claim(ctx, p)
	e.cfg.Observer.StoreCall("claim", e.cfg.Clock.Now().Sub(start), err)
	if err == nil && res.Record == nil {
		err = &CorruptError{Key: key, Reason: "store answered a claim with no record"}
	}
	if err != nil {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeStoreError)
		f.claimErr = &StoreError{Op: "claim", Key: key, Err: err}
		close(f.claimed)
		e.land(key, f, nil)
		return outcome{}, f.claimErr
	}
	f.claimRec, f.acquired = res.Record, res.Acquired
	close(f.claimed)
	if !res.Acquired {
		e.land(key, f, nil)
		return e.existing(key, id, res.Record)
	}
	e.cfg.Observer.Observe(id.Key.Name, OutcomeAcquired)
	if res.Takeover {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeTakeover)
		e.cfg.Logger.Info("idem: took over a claim whose lease had passed", "key", key, "fence", res.Record.Fence)
	}
	return e.execute(ctx, f, key, id, res.Record, lease, op)
}

// execute runs op under the claim rec and records its outcome.
func (e *Engine) execute(ctx context.Context, f *flight, key string, id Identity, rec *Record, lease time.Duration, op opFunc) (outcome, error) {
	fence := rec.Fence
	opCtx, cancel := context.WithCancelCause(ctx)
	opCtx = NewContext(opCtx, Claim{Key: key, Fence: fence, Owner: rec.Owner})
	var rn *renewer
	// A lease taken from the context's deadline already covers all the
	// operation can do: the context ends there. Renewing it would only keep
	// the key from a retry after a timed-out caller (a Lambda invocation)
	// was ended.
	if _, hasDeadline := ctx.Deadline(); e.cfg.RenewInterval > 0 && !hasDeadline {
		rn = &renewer{e: e, key: key, scope: id.Key.Name, fence: fence, lease: lease, expiresAt: rec.ExpiresAt, cancel: cancel}
		rn.start()
	}
	finished := false
	defer func() {
		if finished {
			return
		}
		// op panicked: release the claim so a retry can run; the panic
		// goes on up the stack.
		rn.stop()
		cancel(nil)
		e.release(ctx, key, id, fence)
		e.land(key, f, nil)
	}()
	result, value, opErr := op(opCtx)
	finished = true
	rn.stop()
	cancel(nil)
	out := outcome{fence: fence}
	now := Millis(e.cfg.Clock.Now())

	var encErr *encodeError
	var term *TerminalError
	var unc *UncertainError
	switch {
	case errors.As(opErr, &encErr):
		e.storeUnreplayable(ctx, key, id, rec, now, "idem.result_encoding", encErr.Error())
		e.land(key, f, nil)
		return out, nil
	case opErr == nil:
		done := &Record{Key: key, Status: StatusCompleted, Fence: fence, Fingerprint: id.Fingerprint,
			Result: result, ExpiresAt: now + e.cfg.Expiry.Milliseconds(), CompletedAt: now}
		if e.cfg.MaxResultBytes > 0 && len(result) > e.cfg.MaxResultBytes {
			e.storeUnreplayable(ctx, key, id, rec, now, CodeResultTooLarge,
				fmt.Sprintf("result of %d bytes is over the limit of %d", len(result), e.cfg.MaxResultBytes))
		} else if e.complete(ctx, key, id, rec, done) {
			if e.cache != nil {
				e.cache.put(done, value)
			}
		}
		e.land(key, f, done)
		return out, nil
	case errors.As(opErr, &term):
		er := term.record()
		e.fail(ctx, key, id, rec, now, er)
		e.land(key, f, &Record{Key: key, Status: StatusFailed, Fence: fence, Fingerprint: id.Fingerprint, Err: &er})
		return out, opErr
	case errors.As(opErr, &unc):
		// The effect is unknown: keep the claim until its lease ends, so
		// that no retry runs the operation again before then.
		e.cfg.Observer.Observe(id.Key.Name, OutcomeUncertain)
		e.cfg.Logger.Warn("idem: outcome uncertain; the claim is kept until its lease ends",
			"key", key, "fence", fence, "err", unc.Err)
		e.land(key, f, nil)
		return out, opErr
	default:
		e.release(ctx, key, id, fence)
		e.land(key, f, nil)
		return out, opErr
	}
}

func (e *Engine) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.cfg.WriteTimeout)
}

// complete records a success; it reports whether the store took it.
func (e *Engine) complete(ctx context.Context, key string, id Identity, rec *Record, done *Record) bool {
	if done.CompletedAt >= rec.ExpiresAt {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeCompleteFailed)
		e.cfg.Logger.Error("idem: claim expired while the operation ran; outcome not recorded",
			"key", key, "fence", rec.Fence)
		return false
	}
	wctx, cancel := e.writeCtx(ctx)
	defer cancel()
	start := e.cfg.Clock.Now()
	err := e.store.Complete(wctx, CompleteParams{Key: key, Fence: rec.Fence, Now: done.CompletedAt, ExpiresAt: done.ExpiresAt, Result: done.Result})
	e.cfg.Observer.StoreCall("complete", e.cfg.Clock.Now().Sub(start), err)
	if errors.Is(err, ErrTooLarge) {
		e.storeUnreplayable(ctx, key, id, rec, done.CompletedAt, CodeResultTooLarge, err.Error())
		return false
	}
	var fe *FencedError
	if errors.As(err, &fe) && fe.Current == rec.Fence && fe.Status == StatusCompleted {
		// Only this claim's holder can complete under its fence: the
		// operation completed the record itself, inside its own transaction
		// (see pgstore.DoTx).
		return true
	}
	if err != nil {
		e.writeFailed(key, id, rec.Fence, "complete", err)
		return false
	}
	return true
}

// storeUnreplayable marks a successful call whose result cannot be stored
// as FAILED with code, so that retries get a clear error instead of running
// the operation a second time.
func (e *Engine) storeUnreplayable(ctx context.Context, key string, id Identity, rec *Record, now int64, code, msg string) {
	e.cfg.Observer.Observe(id.Key.Name, OutcomeCompleteFailed)
	e.cfg.Logger.Error("idem: operation succeeded but its result cannot be stored; retries will get an error",
		"key", key, "code", code, "reason", msg)
	e.fail(ctx, key, id, rec, now, ErrorRecord{Code: code, Message: msg})
}

func (e *Engine) fail(ctx context.Context, key string, id Identity, rec *Record, now int64, er ErrorRecord) {
	wctx, cancel := e.writeCtx(ctx)
	defer cancel()
	start := e.cfg.Clock.Now()
	err := e.store.Fail(wctx, FailParams{Key: key, Fence: rec.Fence, Now: now, ExpiresAt: now + e.cfg.Expiry.Milliseconds(), Err: er})
	e.cfg.Observer.StoreCall("fail", e.cfg.Clock.Now().Sub(start), err)
	if err != nil {
		e.writeFailed(key, id, rec.Fence, "fail", err)
		return
	}
	e.cfg.Observer.Observe(id.Key.Name, OutcomeFailed)
}

func (e *Engine) release(ctx context.Context, key string, id Identity, fence uint64) {
	wctx, cancel := e.writeCtx(ctx)
	defer cancel()
	start := e.cfg.Clock.Now()
	err := e.store.Release(wctx, ReleaseParams{Key: key, Fence: fence, Now: Millis(start)})
	e.cfg.Observer.StoreCall("release", e.cfg.Clock.Now().Sub(start), err)
	if err != nil && !errors.Is(err, ErrNotFound) {
		e.writeFailed(key, id, fence, "release", err)
		return
	}
	e.cfg.Observer.Observe(id.Key.Name, OutcomeReleased)
}

func (e *Engine) writeFailed(key string, id Identity, fence uint64, method string, err error) {
	level := slog.LevelError
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound) {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeFenced)
		level = slog.LevelWarn
	} else {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeStoreError)
	}
	if method == "complete" {
		e.cfg.Observer.Observe(id.Key.Name, OutcomeCompleteFailed)
	}
	e.cfg.Logger.Log(context.Background(), level, "idem: store "+method+" failed after the operation ran",
		"key", key, "fence", fence, "err", err)
}

// renewer extends the lease while an operation runs.
type renewer struct {
	e         *Engine
	key       string
	scope     string
	fence     uint64
	lease     time.Duration
	expiresAt int64
	cancel    context.CancelCauseFunc

	mu      sync.Mutex
	stopped bool
	timer   Timer
}

func (r *renewer) start() {
	r.mu.Lock()
	r.timer = r.e.cfg.Clock.AfterFunc(r.interval(), r.fire)
	r.mu.Unlock()
}

func (r *renewer) interval() time.Duration {
	return min(r.e.cfg.RenewInterval, max(r.lease/3, time.Millisecond))
}

func (r *renewer) fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	e := r.e
	now := Millis(e.cfg.Clock.Now())
	until := min(now+max(r.lease.Milliseconds(), 1), r.expiresAt)
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.WriteTimeout)
	start := e.cfg.Clock.Now()
	err := e.store.Extend(ctx, ExtendParams{Key: r.key, Fence: r.fence, Now: now, LeaseUntil: until})
	e.cfg.Observer.StoreCall("extend", e.cfg.Clock.Now().Sub(start), err)
	cancel()
	switch {
	case errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound):
		e.cfg.Observer.Observe(r.scope, OutcomeFenced)
		e.cfg.Logger.Error("idem: lease renewal refused; the key was taken over, cancelling the operation",
			"key", r.key, "fence", r.fence, "err", err)
		r.stopped = true
		r.cancel(ErrLeaseLost)
		return
	case err != nil:
		e.cfg.Observer.Observe(r.scope, OutcomeStoreError)
		e.cfg.Logger.Warn("idem: lease renewal failed; will retry", "key", r.key, "err", err)
	}
	if until >= r.expiresAt {
		return // the claim cannot outlive its expiry
	}
	r.timer = e.cfg.Clock.AfterFunc(r.interval(), r.fire)
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
