// The write loop: outcome writes retried with backoff while the write
// timeout lasts, each attempt under a context of its own.

package idem

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

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
	writeStep
)

// writeReq is one fenced write of a holder: its kind, and what that kind
// writes.
type writeReq struct {
	kind   writeKind
	result []byte                      // writeComplete: the encoded value
	err    *store.ErrorRecord          // writeFail: the terminal error
	extend func(p *store.ExtendParams) // writeExtend: sets the new lease and reference
	step   *store.Step                 // writeStep: the finished step (At set by each attempt)
	index  int                         // writeStep: its number
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
	backoff := store.Backoff{Step: writeBackoff, Max: maxWriteBackoff}
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			now = e.cfg.Clock.Now()
		}
		w := &h.wctx
		if h.wctxUse {
			w = new(writeCtx)
		}
		h.wctxUse = true
		w.init(ctx, e.realNow(now).Add(min(deadline.Sub(now), h.writeAttempt())))
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
		wait := backoff.Pause()
		if e.cfg.Clock.Now().Add(wait).After(deadline) {
			e.cfg.Logger.Error("idem: giving up on a store write after WriteTimeout",
				"key", h.key, "op", req.kind.op(), "attempts", attempt, "write_timeout", e.cfg.WriteTimeout, "err", err)
			return err
		}
		e.cfg.Observer.Observe(h.name, observe.OutcomeWriteRetried)
		h.event(observe.Event{Kind: observe.EventWriteRetry, Op: req.kind.op(), Attempt: attempt, Delay: wait, Err: err})
		e.cfg.Logger.Warn("idem: store write failed; retrying", "key", h.key, "op", req.kind.op(), "attempt", attempt, "err", err)
		<-e.cfg.Clock.After(wait)
	}
}

// writeAttempt is how long one attempt of an outcome write may take: a
// third of Config.WriteTimeout, and no more than half the lease (but at
// least a second), so that an attempt whose reply never comes — a
// connection that hangs rather than fails — is given up and tried again
// on another while the lease still holds, instead of outlasting it.
func (h *holder) writeAttempt() time.Duration {
	return writeAttempt(h.e.cfg.WriteTimeout, h.lease)
}

// writeAttempt is the bound of one attempt of an outcome write made under
// a lease (0: none known): a third of writeTimeout, at most half the lease
// but at least a second.
func writeAttempt(writeTimeout, lease time.Duration) time.Duration {
	d := max(writeTimeout/3, time.Millisecond)
	if lease > 0 {
		d = min(d, max(lease/2, time.Second))
	}
	return d
}

// try makes one attempt of a write at now (ms).
func (h *holder) try(ctx context.Context, req *writeReq, now int64) error {
	e := h.e
	start := e.callStart(time.Time{})
	ctx, ss := h.storeSpan(ctx, req.kind.op())
	ref := h.ref(now)
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
	case writeStep:
		ref.From = 0 // a step is recorded under an IN_PROGRESS claim only
		st := *req.step
		st.At = now
		err = e.store.(store.Stepper).RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: req.index, Step: st})
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
	case writeStep:
		return observe.StoreStep
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
	return !store.TakenOver(err) &&
		!errors.Is(err, store.ErrTooLarge) && !errors.Is(err, store.ErrCorrupt) &&
		!errors.Is(err, store.ErrMisconfigured) && !errors.Is(err, store.ErrInvalidParams)
}

func (h *holder) writeFailed(op observe.StoreOp, err error) {
	e := h.e
	level := slog.LevelError
	if store.TakenOver(err) {
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
