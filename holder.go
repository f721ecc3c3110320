// The holder of a claim: the operation run under a renewed lease, and the
// outcome it records (complete, fail or release).

package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

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

	// lease (above) is a renewed lease's length: the claim's, at most
	// Config.Lease. claimedUntil is the lease end the claim was made with
	// (ms; the context's deadline, if it had one): a renewal never moves
	// the lease before it.
	claimedUntil int64

	// from is the status the record must be in for the outcome write:
	// zero (IN_PROGRESS) but for a token read from a settled record.
	from store.Status
	// detached is set once the operation handed its claim off ([Detach]):
	// the engine then writes no outcome for it.
	detached atomic.Bool
	// steps are the operation's finished steps ([Step]).
	steps stepLog

	opCtx   opContext
	batch   *batchWriter            // the batch whose writer records a success; nil for Do
	bi      int                     // the call's index in that batch
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
	lost     bool  // a renewal was refused: the key was taken over
	next     int64 // when the next renewal is due (Clock, UnixNano)
	qi       int   // index in the renewal queue; -1 when not queued
}

// ref names the holder's claim in a fenced write at now (ms): the one
// store.ClaimRef of every write a holder makes (outcomes, renewals, writes
// through a token, which may correct a settled record: From).
func (h *holder) ref(now int64) store.ClaimRef {
	return store.ClaimRef{Key: h.key, Fence: h.fence, Owner: h.owner, From: h.from, Now: now}
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

// execute runs op under the claim (taken by hold) and records its
// outcome. The lease is renewed until the outcome is written (or the
// engine gives up on it), so that retried outcome writes never hand the
// key to a second execution. An item of a batch whose success is written
// with the batch's others (h.batch) hands its Complete to the batch and
// returns errQueued: the batch answers it once the write lands.
func (h *holder) execute() (outcome, error) {
	e := h.e
	// The outcome writes take the operation's context for its values
	// only: they go on once it is cancelled (writeCtx).
	ctx := h.opCtx.Context
	finished := false
	defer func() {
		if finished {
			return
		}
		// op panicked: release the claim so a retry can run, unless it
		// was handed off; the panic goes on up the stack.
		h.stopRenewal()
		if !h.detached.Load() {
			h.giveUp(ctx)
		}
		e.land(h.key, h.flight, nil)
	}()
	res, opErr := h.op.runOp(&h.opCtx)
	finished = true
	if h.cancel != nil {
		h.cancel(nil)
	}
	if h.batch != nil && opErr == nil && !res.selfRecorded && !h.detached.Load() &&
		(e.cfg.MaxResultBytes <= 0 || len(res.result) <= e.cfg.MaxResultBytes) {
		h.batch.queue(h, res)
		return outcome{}, errQueued
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
		unc    *uncertainError
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
		return h.giveUp(ctx), opErr
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
		er := resultTooLarge(len(result), e.cfg.MaxResultBytes)
		return h.storeUnreplayable(ctx, er.Code, er.Message, e.cfg.MaxResultBytes)
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

// resultTooLarge is the stored error of a successful result of n bytes,
// over Config.MaxResultBytes (limit): the one rule of Do's complete and
// of DoCompleting's Params.
func resultTooLarge(n, limit int) store.ErrorRecord {
	return boundedError(CodeResultTooLarge, fmt.Sprintf("result of %d bytes is over the limit of %d", n, limit), limit)
}

// boundedError is a stored error whose size ([ErrorRecord.Size]) fits
// limit (negative: no limit): the message cut on a UTF-8 boundary, no body.
// The code is not counted against a store's limit, so the marker fits any
// limit, even 0.
func boundedError(code, msg string, limit int) store.ErrorRecord {
	if limit >= 0 && len(msg) > limit {
		msg = strings.ToValidUTF8(msg[:limit], "")
	}
	return store.ErrorRecord{Code: code, Message: validText(msg)}
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
