// Batches: DoBatch runs many keys at once, their claims and outcome writes
// shared (store.BatchClaimer, store.BatchCompleter), their operations on
// the engine's workers (workers.go).

package idem

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// DoBatch is [DoIdentity] for a batch of keys, as a consumer receives them
// (an SQS batch): the keys are claimed together — in one round trip when
// the store is a [store.BatchClaimer], as redisstore's pipeline is — and
// fn(ctx, i) then runs for each ids[i] whose key was claimed, up to
// concurrency at once (0: all at once; 1: in order), each with its own
// lease and outcome write, as DoIdentity's would be. results[i] and
// errs[i] answer ids[i] exactly as DoIdentity would have: a value, a
// replay, an [*InProgressError], a [*MismatchError], a [*StoreError] of the
// claim. A key named twice is a duplicate in flight: the later one answers
// from the earlier, as concurrent calls in one process do. Over a store
// without batch claims, each key is claimed by its own call, concurrently.
//
// It is [DoBatchWith] with only BatchOptions.Concurrency set.
func DoBatch[T any](ctx context.Context, e *Engine, ids []Identity, concurrency int, fn func(ctx context.Context, i int) (T, error)) (results []Result[T], errs []error) {
	return DoBatchWith(ctx, e, ids, BatchOptions[T]{Concurrency: concurrency}, fn)
}

// BatchOptions are the options of [DoBatchWith].
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
	// caller's or one of the batch's workers), possibly concurrently for
	// different items; DoBatchWith returns after every call has
	// returned. It is not called for an item whose fn panicked.
	Answered func(i int, res Result[T], err error)
	// Runner, when not nil, runs the batch's operations on its workers,
	// which outlive the batch (see [BatchRunner]); nil, the runner of
	// ctx ([WithBatchRunner]), or else the engine's workers, which end
	// when no batch of the engine runs.
	Runner *BatchRunner
}

// DoBatchWith is [DoBatch] with options: the batch's concurrency and a
// callback for each item's answer as soon as it is known.
//
// No goroutine is started per item. The operations run on at most
// Concurrency goroutines, the caller's among them, taking the claimed
// items in order; the goroutines besides the caller's are the workers of
// a [BatchRunner] (BatchOptions.Runner, or ctx's), which outlive the
// batch, or else the engine's batch workers, reused while batches of the
// engine overlap and ended when none runs. An item that did not claim its key answers on the
// caller's goroutine, at once — except one that may have to wait for
// another holder of its key (Config.Wait above zero: a duplicate of a key
// in flight, or a key held elsewhere), which waits on a goroutine of its
// own so that it holds up nothing else.
//
// A panic of fn is handled as by DoIdentity (the key is released), and
// DoBatchWith raises it again on the caller's goroutine once every other
// item has answered.
func DoBatchWith[T any](ctx context.Context, e *Engine, ids []Identity, o BatchOptions[T], fn func(ctx context.Context, i int) (T, error)) (results []Result[T], errs []error) {
	n := len(ids)
	results, errs = make([]Result[T], n), make([]error, n)
	concurrency := o.Concurrency
	if concurrency <= 0 || concurrency > n {
		concurrency = n
	}
	answer := func(i int, r Result[T], err error) {
		results[i], errs[i] = r, err
		if o.Answered != nil {
			o.Answered(i, r, err)
		}
	}
	var batch call // the batch's span, when traced: each key's call is its child
	if e.tracer != nil {
		ctx, batch.span = e.tracer.StartCall(ctx, observe.Call{Kind: observe.CallBatch, DBSystem: e.dbSystem, BatchSize: n})
		defer batch.endSpan(observe.CallEnd{})
	}
	b := batchWork{runner: batchRunner(o.Runner, ctx)}
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
		t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.Fingerprint, op: t}
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
		for j, i := range leaders {
			k := &kn[i]
			k.res, k.err = calls[i].claimAnswer(res[j], cerrs[j])
			tell(k.f, k.res, k.err)
		}
	}
	run := func(i int) {
		out, err := calls[i].run(ctx, &kn[i])
		r, err := calls[i].result(ctx, out, err)
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
	runner   *BatchRunner // nil: the engine's workers
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
