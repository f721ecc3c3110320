// Batches: DoBatch runs many keys at once, their claims and outcome writes
// shared (store.BatchClaimer, store.BatchCompleter), their operations on
// the engine's workers (workers.go).

package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// BatchOptions are the options of [DoBatch]; a nil *BatchOptions is the
// zero value: every item at once, no Answered.
type BatchOptions[T any] struct {
	// Concurrency is how many of the batch's operations run at once: 0,
	// all of them; 1, one after the other, in order.
	Concurrency int
	// Answered, when not nil, is called with each item's answer as soon
	// as it is known — for an item that ran fn, once its outcome write
	// has landed (or failed) — rather than when the whole batch has
	// answered: a consumer settles each message by it (package consume).
	// It is called exactly once for each item, with what results[i] and
	// errs[i] will hold, from the goroutine that answered the item (the
	// caller's, one of the batch's workers, or the one writing the
	// batch's outcomes), possibly concurrently for different items;
	// DoBatch returns after every call has returned. It is not called
	// for an item whose fn panicked.
	Answered func(i int, res Result[T], err error)
}

// DoBatch runs fn(ctx, i) at most once for each key of ids, as a consumer
// receives them (an SQS batch, a poll of a partition): pick it for a
// batch of messages, [Do] for one call. The batch is one unit from claim
// to outcome:
//
//   - the keys are claimed together, in one round trip when the store is a
//     [store.BatchClaimer] (else each key is claimed by its own call when
//     its turn comes);
//   - every claim is held from then on: the leases of the items waiting
//     for their turn are renewed together (one round trip per renewal
//     over a [store.BatchExtender]), and an item whose claim was lost
//     while it waited — a renewal refused because another caller took
//     the key over, or a lease that passed — does not run: it answers an
//     error wrapping [ErrLeaseLost] (a consumer's verdict: Leave);
//   - fn runs for each claimed item, up to o.Concurrency at once (0: all
//     at once; 1: in order), under its item's claim, renewed while it runs;
//   - the successes are recorded together: an item that succeeded hands
//     its Complete to the batch and the next item starts; the Completes
//     that gather while one write is in flight go in one round trip when
//     the store is a [store.BatchCompleter]. Terminal errors and releases
//     are written at once, as by DoIdentity.
//
// results[i] and errs[i] answer ids[i] exactly as DoIdentity would have:
// a value, a replay, an [*InProgressError], a [*MismatchError], a
// [*StoreError] of the claim; an item whose success could not be recorded
// has Result.Unrecorded set, as DoIdentity's. A key named twice is a
// duplicate in flight: the later one answers from the earlier, as
// concurrent calls in one process do. o may be nil for the defaults.
//
// No goroutine is started per item. The operations run on at most
// Concurrency goroutines, the caller's among them, taking the claimed
// items in order; the goroutines besides the caller's are the workers of
// ctx ([WithBatchWorkers]), which outlive the batch, or
// else the engine's batch workers, reused while batches of the engine
// overlap and ended when none runs. An item that did not claim its key
// answers on the caller's goroutine, at once — except one that may have
// to wait for another holder of its key (Config.Wait above zero: a
// duplicate of a key in flight, or a key held elsewhere), which waits on a
// goroutine of its own so that it holds up nothing else.
//
// A panic of fn is handled as by DoIdentity (the key is released), and
// DoBatch raises it again on the caller's goroutine once every other
// item has answered.
func DoBatch[T any](ctx context.Context, e *Engine, ids []Identity, o *BatchOptions[T], fn func(ctx context.Context, i int) (T, error)) (results []Result[T], errs []error) {
	var opts BatchOptions[T]
	if o != nil {
		opts = *o
	}
	n := len(ids)
	results, errs = make([]Result[T], n), make([]error, n)
	concurrency := opts.Concurrency
	if concurrency <= 0 || concurrency > n {
		concurrency = n
	}
	answer := func(i int, r Result[T], err error) {
		results[i], errs[i] = r, err
		if opts.Answered != nil {
			opts.Answered(i, r, err)
		}
	}
	var batch call // the batch's span, when traced: each key's call is its child
	if e.tracer != nil {
		ctx, batch.span = e.tracer.StartCall(ctx, observe.Call{Kind: observe.CallBatch, DBSystem: e.dbSystem, BatchSize: n})
		defer batch.endSpan(observe.CallEnd{})
	}
	b := batchWork{runner: batchRunner(ctx)}
	defer b.wait()
	bc, batched := e.store.(store.BatchClaimer)
	if e.cfg.Disabled || !batched || n < 2 {
		// Each key claimed by its own call, in order: a duplicate of an
		// earlier key of the batch waits for a call that is already running.
		b.runAll(e, n, concurrency, func(i int) {
			r, err := DoIdentity(ctx, e, ids[i], func(ctx context.Context) (T, error) { return fn(ctx, i) })
			answer(i, r, err)
		})
		return results, errs
	}

	// Each call goes the one path (holder.run), its first round made here
	// for all at once: the cache, the key's flight joined, and the leaders'
	// claims in one batch.
	calls := make([]*typedCall[T], n)
	all := make([]typedCall[T], n) // the calls, in one allocation
	kn := make([]known, n)
	leaders := make([]int, 0, n) // calls that lead their key's flight, to claim
	params := make([]store.ClaimParams, 0, n)
	now, lease, lerr := e.leaseFor(ctx)
	keep := e.cache != nil && cacheable[T]()
	for i, id := range ids {
		t := &all[i]
		t.fn, t.keep = runFunc[T](func(ctx context.Context) (T, error) { return fn(ctx, i) }), keep
		t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.storedForm(), hold: id.HoldCrashed, op: t}
		if e.tracer != nil {
			t.startSpan(ctx, observe.CallDo, observe.TraceContext{})
			sp := t.span
			t.fn = runFunc[T](func(ctx context.Context) (T, error) { return fn(sp.Context(ctx), i) })
		}
		if out, hit, err := t.cached(store.Millis(now)); hit || lerr != nil {
			if !hit {
				err = lerr
			}
			r, err := t.result(ctx, out, err)
			answer(i, r, err)
			continue
		}
		calls[i] = t
		t.flUsed = true
		f, leader := e.join(t.key, &t.fl)
		kn[i] = known{f: f, leader: leader, now: now, lease: lease}
		if leader {
			leaders = append(leaders, i)
			params = append(params, t.claimParams(ctx, now, lease, true))
		}
	}
	w := &batchWriter{e: e, size: len(leaders)}
	if len(params) > 0 {
		start := e.callStart(now)
		sctx, ss := batch.storeSpan(ctx, observe.StoreClaimBatch)
		res, cerrs := bc.ClaimBatch(sctx, params)
		var first error
		if len(res) != len(params) || len(cerrs) != len(params) {
			first = &store.CorruptError{Key: params[0].Key, Reason: "store answered a batch claim with the wrong number of results"}
			res, cerrs = make([]store.ClaimResult, len(params)), make([]error, len(params))
			for j := range cerrs {
				cerrs[j] = first
			}
		}
		for _, err := range cerrs {
			if err != nil {
				first = err
				break
			}
		}
		e.callEnd(observe.StoreClaimBatch, start, first)
		endStore(ss, first)
		// Every flight hears its claim's answer before any operation runs
		// (and takes a slot of concurrency): its followers wait for it.
		// Every claim acquired is held from now on, its lease renewed
		// while it waits for its turn, and its success is written by the
		// batch's writer.
		w.wg, w.safely = &b.wg, b.safely
		w.answer = func(i int, out outcome, err error) {
			r, err := calls[i].result(ctx, out, err)
			answer(i, r, err)
		}
		for j, i := range leaders {
			k := &kn[i]
			k.res, k.err = calls[i].claimAnswer(res[j], cerrs[j])
			tell(k.f, k.res, k.err)
			if k.err == nil && k.res.Acquired {
				t := calls[i]
				t.hold(ctx, k.f, k.now, k.lease, k.res)
				t.batch, t.bi = w, i
			}
		}
	}
	run := func(i int) {
		t := calls[i]
		if t.batch != nil {
			if err := t.turn(); err != nil {
				r, err := t.result(ctx, outcome{}, err)
				answer(i, r, err)
				return
			}
		}
		out, err := t.run(ctx, &kn[i])
		if err == errQueued {
			return // answered by the batch's writer
		}
		r, err := t.result(ctx, out, err)
		answer(i, r, err)
	}
	// The calls that run their operation; those that only answer.
	runs, answers := make([]int, 0, len(leaders)), make([]int, 0, n)
	for i, t := range calls {
		if t == nil {
			continue
		}
		switch k := &kn[i]; {
		case k.leader && k.err == nil && k.res.Acquired:
			runs = append(runs, i)
		case e.cfg.Wait == 0 || k.leader && (k.err != nil || k.res.Record.Status != store.StatusInProgress):
			// Answers at once: a leader whose claim was not acquired
			// answers and lands its flight (a stale flight would answer
			// later calls of its key in this process); a follower, with
			// no Wait, answers from its flight's claim.
			answers = append(answers, i)
		default:
			// May wait for another holder, up to Config.Wait: on a
			// goroutine of its own, taking no slot of concurrency (a slot
			// held by a waiting follower could be the one its leader
			// needs).
			b.wg.Go(func() { b.safely(func() { run(i) }) })
		}
	}
	b.runEach(e, runs, concurrency, answers, run)
	return results, errs
}

// batchWork runs the items of one batch and keeps the first panic of
// their operations, to raise it again on the caller's goroutine.
type batchWork struct {
	runner   *batchWorkers // nil: the engine's workers
	wg       sync.WaitGroup
	mu       sync.Mutex
	panicked bool
	value    any
}

// runAll runs do(i) for every i < n, in order, on up to concurrency
// goroutines: the caller's and the engine's batch workers.
func (b *batchWork) runAll(e *Engine, n, concurrency int, do func(i int)) {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	b.runEach(e, all, concurrency, nil, do)
}

// runEach runs do(i) for each i of runs, in order, on up to concurrency
// goroutines (the caller's and the engine's batch workers), and do(i) for
// each i of first on the caller's goroutine before it takes any of runs.
func (b *batchWork) runEach(e *Engine, runs []int, concurrency int, first []int, do func(i int)) {
	var next atomic.Int64
	drain := func() {
		for {
			j := int(next.Add(1)) - 1
			if j >= len(runs) {
				return
			}
			b.safely(func() { do(runs[j]) })
		}
	}
	if w := min(concurrency, len(runs)) - 1; w > 0 {
		var g *gen
		if b.runner != nil {
			g = b.runner.g
		} else {
			g = e.workers.enter()
			defer e.workers.leave()
		}
		for range w {
			b.wg.Add(1)
			g.run(drain, &b.wg)
		}
	}
	for _, i := range first {
		b.safely(func() { do(i) })
	}
	drain()
	b.wg.Wait()
}

// safely runs f, keeping its panic, if any, for wait.
func (b *batchWork) safely(f func()) {
	defer func() {
		if v := recover(); v != nil {
			b.mu.Lock()
			if !b.panicked {
				b.panicked, b.value = true, v
			}
			b.mu.Unlock()
		}
	}()
	f()
}

// wait waits for the batch's goroutines, then raises the first panic of
// its operations again.
func (b *batchWork) wait() {
	b.wg.Wait()
	if b.panicked {
		panic(b.value)
	}
}

// batchAnswers checks the answers (*errs) of a batch write of n items,
// what (complete, extend), the first for key: answers of the wrong number
// become n CorruptErrors. It returns the batch's fault for the observer:
// the first error that is not a refusal of one item's claim (a refusal is
// that item's answer, not the store's fault).
func batchAnswers(errs *[]error, n int, key, what string) error {
	if len(*errs) != n {
		bad := &store.CorruptError{Key: key, Reason: "store answered a batch " + what + " with the wrong number of results"}
		*errs = make([]error, n)
		for i := range *errs {
			(*errs)[i] = bad
		}
	}
	for _, err := range *errs {
		if err != nil && !store.TakenOver(err) {
			return err
		}
	}
	return nil
}

// errQueued is execute's answer for a success handed to its batch's
// writer, which answers the call once the write lands.
var errQueued = errors.New("idem: queued for the batch's outcome write")

// turn checks, when an item of a batch comes to run, that its claim is
// still held: its renewals, made with the batch's others while it
// waited, were not refused, and its lease has not run low. A lease that
// has (renewals failing) is renewed once more, fenced, before the
// operation runs; if the key was taken over meanwhile, the item does not
// run and its answer wraps [ErrLeaseLost]. A store that cannot tell
// answers a [*StoreError]: the item does not run, and its claim lapses.
func (h *holder) turn() error {
	e := h.e
	r := &e.renewals
	r.mu.Lock()
	lost := h.lost
	r.mu.Unlock()
	var why error
	if !lost {
		now := store.Millis(e.cfg.Clock.Now())
		left := time.Duration(h.flight.leaseUntil.Load()-now) * time.Millisecond
		switch {
		case h.cancel == nil && left > 0, h.cancel != nil && left >= h.interval():
			return nil
		case h.cancel == nil:
			lost, why = true, errors.New("its lease passed while it waited, and it is not renewed")
		default:
			until := h.renewalEnd(now)
			ctx, cancel := context.WithTimeout(context.WithoutCancel(h.opCtx.Context), h.attemptTimeout())
			err := e.timed(observe.StoreExtend, func() error {
				return e.store.Extend(ctx, store.ExtendParams{ClaimRef: h.ref(now), LeaseUntil: until})
			})
			cancel()
			switch {
			case err == nil:
				h.flight.leaseUntil.Store(until)
				return nil
			case store.TakenOver(err):
				lost, why = true, err
			default:
				h.stopRenewal()
				e.land(h.key, h.flight, nil)
				h.observe(observe.OutcomeStoreError)
				return &StoreError{Op: observe.StoreExtend, Key: h.key, Err: err}
			}
		}
	}
	h.stopRenewal()
	e.land(h.key, h.flight, nil)
	h.observe(observe.OutcomeFenced)
	e.cfg.Logger.Warn("idem: a batch item's claim was lost while it waited for its turn; it does not run",
		"key", h.key, "fence", h.fence)
	if why == nil {
		return fmt.Errorf("%w: %s waited for its turn in a batch and the key was taken over; it did not run", ErrLeaseLost, h.key)
	}
	return fmt.Errorf("%w: %s waited for its turn in a batch and did not run: %w", ErrLeaseLost, h.key, why)
}

// batchWriter records the successes of a batch's items together: an item
// that succeeded queues its Complete and its goroutine goes on to the next
// item; one goroutine at a time writes what is queued, in one
// CompleteBatch over a [store.BatchCompleter], so the Completes that
// gather while one write is in flight share the next. Each item keeps its
// own answer: a Complete the batch could not make goes again alone,
// through the one write path with its retries; a refused one (the key
// taken over) is the item's Unrecorded. An item's lease is renewed until
// its write lands.
type batchWriter struct {
	e      *Engine
	answer func(i int, out outcome, err error) // answers call i of the batch
	wg     *sync.WaitGroup                     // the batch's goroutines
	safely func(func())                        // keeps a panic for the batch

	size int // the items of the batch: a queue's capacity

	mu     sync.Mutex
	queued []queuedComplete
	busy   bool // a goroutine writes
}

// queuedComplete is a success waiting for the batch's write.
type queuedComplete struct {
	h   *holder
	res opResult
}

// queue hands h's success to the writer.
func (w *batchWriter) queue(h *holder, res opResult) {
	w.mu.Lock()
	if w.queued == nil {
		w.queued = make([]queuedComplete, 0, w.size)
	}
	w.queued = append(w.queued, queuedComplete{h, res})
	if w.busy {
		w.mu.Unlock()
		return
	}
	w.busy = true
	w.mu.Unlock()
	w.wg.Go(func() { w.safely(w.drain) })
}

// drain writes what is queued, then answers the calls it wrote for. What
// was queued meanwhile is written by another goroutine, started before
// the answers are made, so that an answer that takes its time (a
// consumer's ack) holds up no write.
func (w *batchWriter) drain() {
	w.mu.Lock()
	q := w.queued
	w.queued = nil
	w.mu.Unlock()
	outs := w.write(q)
	w.mu.Lock()
	if len(w.queued) > 0 {
		w.wg.Go(func() { w.safely(w.drain) })
	} else {
		w.busy = false
	}
	w.mu.Unlock()
	for i, c := range q {
		w.answer(c.h.bi, outs[i], nil)
	}
}

// write records the successes of q and returns each call's outcome; each
// holder's renewal is stopped and its flight landed.
func (w *batchWriter) write(q []queuedComplete) []outcome {
	e := w.e
	now := store.Millis(e.cfg.Clock.Now())
	errs, outs := make([]error, len(q)), make([]outcome, len(q))
	bc, batched := e.store.(store.BatchCompleter)
	if batched && len(q) > 1 {
		ps := make([]store.CompleteParams, len(q))
		for i, c := range q {
			ps[i] = store.CompleteParams{ClaimRef: c.h.ref(now), ExpiresAt: now + e.cfg.Expiry.Milliseconds(), Result: c.res.result}
		}
		attempt := q[0].h.writeAttempt() // the shortest of the holders' attempts
		for _, c := range q[1:] {
			attempt = min(attempt, c.h.writeAttempt())
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(q[0].h.opCtx.Context), attempt)
		var spans []observe.StoreSpan // each call's span of its Complete, when traced
		if e.tracer != nil {
			spans = make([]observe.StoreSpan, len(q))
			for i, c := range q {
				_, spans[i] = c.h.storeSpan(ctx, observe.StoreComplete)
			}
		}
		_ = e.timed(observe.StoreComplete, func() error {
			errs = bc.CompleteBatch(ctx, ps)
			return batchAnswers(&errs, len(ps), ps[0].Key, "complete")
		})
		cancel()
		for i, ss := range spans {
			endStore(ss, errs[i])
		}
	} else {
		for i := range errs {
			errs[i] = errQueued // not tried: each goes alone below
		}
	}
	for i, c := range q {
		h := c.h
		var unrecorded error
		switch err := errs[i]; {
		case err == nil:
			h.noteCompleted(c.res.result, now)
			if e.cache != nil {
				h.cachePut(c.res.value)
			}
		case store.TakenOver(err):
			h.writeFailed(observe.StoreComplete, err)
			unrecorded = err
		default:
			unrecorded = h.complete(h.opCtx.Context, c.res.result, c.res.value)
		}
		h.stopRenewal()
		e.land(h.key, h.flight, h)
		outs[i] = outcome{fence: h.fence, recorded: h.wrote, unrecorded: unrecorded}
	}
	return outs
}
