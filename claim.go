// The claim round of a call: the cache, the in-process flight, the store's
// claim, and the answers to an existing record (replay, mismatch, in
// progress, wait and follow).

package idem

import (
	"context"
	"errors"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

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
	fingerprint string // stored form: the rules' version and the digest (storedFingerprint)
	hold        bool   // the takeover policy Hold (Config, or the call's Identity)
	op          operation
	span        observe.Span // the call's span, when the observer traces it
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
	backoff := store.Backoff{Step: e.cfg.WaitBackoff, Max: e.cfg.MaxWaitBackoff}
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
		if err == nil || err == errQueued {
			return out, err
		}
		ipe, busy := asInProgress(err)
		if busy && e.waits(ipe) {
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

// waits reports whether a call that found the key in progress waits for
// it (Config.Wait). Work handed elsewhere (a reference is attached) runs for
// its expected completion, not for a wait's worth: it is answered at once.
func (e *Engine) waits(busy *InProgressError) bool {
	return e.cfg.Wait > 0 && busy.Ref == ""
}

// pause waits one backoff step before the next claim attempt. It returns
// ErrInProgress when the wait budget is spent, or the context's error.
func (e *Engine) pause(ctx context.Context, deadline time.Time, backoff *store.Backoff) error {
	remaining := deadline.Sub(e.cfg.Clock.Now())
	if remaining <= 0 {
		return ErrInProgress
	}
	d := min(backoff.Pause(), remaining)
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
	if !ok || !f.acquired || !e.waits(busy) {
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
		if rec.Held(store.Millis(c.e.cfg.Clock.Now())) {
			c.observe(observe.OutcomeHeld)
			return outcome{}, heldError(c.key, rec)
		}
		ipe := &InProgressError{Key: c.key, LeaseUntil: store.FromMillis(rec.LeaseUntil), Owner: rec.Owner, Ref: rec.Ref}
		if rec.CreatedAt > 0 {
			ipe.Since = store.FromMillis(rec.CreatedAt)
		}
		return outcome{}, ipe
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
// that has ended, or a deadline passed, is an error. The deadline sets the
// first lease only: the holder renews it while the operation runs (see
// holder.execute), so that a retry after a holder that is gone takes over
// at the deadline, and one after a holder that runs on does not.
func (e *Engine) leaseFor(ctx context.Context) (time.Time, time.Duration, error) {
	e.syncClock(ctx)
	now := e.cfg.Clock.Now()
	lease := e.cfg.Lease
	if dl, ok := ctx.Deadline(); ok {
		at := now
		if e.clock != nil {
			at = e.realNow(now) // the deadline is on the real clock, now on the store's
		}
		lease = dl.Sub(at)
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

// noteAcquired tells the observer, the call's span and, for a takeover,
// the log that the call's claim was acquired: the note of every claim, run
// by Do or begun by Begin.
func (c *call) noteAcquired(res store.ClaimResult) {
	c.observe(observe.OutcomeAcquired)
	if res.Takeover {
		c.e.cfg.Observer.Observe(c.name, observe.OutcomeTakeover)
		c.event(observe.Event{Kind: observe.EventTakeover, Fence: res.Record.Fence, Owner: res.Record.Owner})
		c.e.cfg.Logger.Info("idem: took over a claim whose lease had passed", "key", c.key, "fence", res.Record.Fence)
	}
}

// acquired runs the operation under the claim res acquired at now, its
// followers told. A call of a batch took its claim when the batch claimed
// (hold), and may have waited for its turn since.
func (h *holder) acquired(ctx context.Context, f *flight, now time.Time, lease time.Duration, res store.ClaimResult) (outcome, error) {
	if h.opCtx.h == nil {
		h.hold(ctx, f, now, lease, res)
	}
	return h.execute()
}

// hold takes the claim res acquired at now: the holder's fence and lease,
// the operation's context, and the lease's renewal, which starts now,
// whether the operation runs at once (Do) or waits for its turn in a
// batch: a claim is held from the moment it is made.
//
// The lease is renewed while the operation runs, whatever deadline its
// caller set: a deadline says when the caller stops waiting, not when
// the operation stops (most handlers run on after their context ended),
// and a lease that ran out under a running operation would hand its key
// to a retry at another server, which would run it again. The
// deadline sets the first lease only, so a retry takes over promptly
// when the holder is gone. Only a context marked [EndsAtDeadline] (an
// AWS Lambda invocation, which is ended at its deadline) keeps the
// deadline as its lease: its holder is gone there.
func (h *holder) hold(ctx context.Context, f *flight, now time.Time, lease time.Duration, res store.ClaimResult) {
	e := h.e
	h.noteAcquired(res)
	h.fence, h.owner, h.expiresAt, h.flight = res.Record.Fence, res.Record.Owner, res.Record.ExpiresAt, f
	h.lease, h.claimedUntil = min(lease, e.cfg.Lease), res.Record.LeaseUntil
	h.steps.reset(res.Record.Steps) // a takeover's finished steps, resumed by Step
	h.opCtx = opContext{Context: ctx, h: h}
	if e.cfg.RenewInterval > 0 && !endsAtDeadline(ctx) {
		h.opCtx.Context, h.cancel = context.WithCancelCause(ctx)
		e.renewals.start(h, now)
	}
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
		NoTakeover:  c.e.holdOff(),
		Hold:        c.hold || c.e.cfg.HoldCrashed,
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
