package idem

import (
	"context"
	"sync"

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
func DoBatch[T any](ctx context.Context, e *Engine, ids []Identity, concurrency int, fn func(ctx context.Context, i int) (T, error)) (results []Result[T], errs []error) {
	n := len(ids)
	results, errs = make([]Result[T], n), make([]error, n)
	if concurrency <= 0 || concurrency > n {
		concurrency = n
	}
	sem := make(chan struct{}, max(concurrency, 1))
	var wg sync.WaitGroup
	async := func(f func()) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f()
		})
	}
	var batch call // the batch's span, when traced: each key's call is its child
	if e.tracer != nil {
		ctx, batch.span = e.tracer.StartCall(ctx, observe.Call{Kind: observe.CallBatch, DBSystem: e.dbSystem, BatchSize: n})
		defer batch.endSpan(observe.CallEnd{})
	}
	defer wg.Wait()
	bc, batched := e.store.(store.BatchClaimer)
	if e.cfg.Disabled || !batched || n < 2 {
		for i, id := range ids {
			async(func() {
				results[i], errs[i] = DoIdentity(ctx, e, id, func(ctx context.Context) (T, error) { return fn(ctx, i) })
			})
		}
		return results, errs
	}

	// Each call goes the one path (holder.run), its first round made here
	// for all at once: the cache, the key's flight joined, and the leaders'
	// claims in one batch.
	calls := make([]*typedCall[T], n)
	kn := make([]known, n)
	var (
		leaders []int // calls that lead their key's flight, to claim
		params  []store.ClaimParams
	)
	now, lease, lerr := e.leaseFor(ctx)
	keep := e.cache != nil && cacheable[T]()
	for i, id := range ids {
		t := &typedCall[T]{fn: func(ctx context.Context) (T, error) { return fn(ctx, i) }, keep: keep}
		t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.Fingerprint, op: t}
		if e.tracer != nil {
			t.startSpan(ctx, observe.CallDo, observe.TraceContext{})
			sp := t.span
			t.fn = func(ctx context.Context) (T, error) { return fn(sp.Context(ctx), i) }
		}
		if out, hit, err := t.cached(store.Millis(now)); hit || lerr != nil {
			if !hit {
				err = lerr
			}
			results[i], errs[i] = t.result(ctx, out, err)
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
	for i, t := range calls {
		if t == nil {
			continue
		}
		run := func() {
			out, err := t.run(ctx, &kn[i])
			results[i], errs[i] = t.result(ctx, out, err)
		}
		if k := &kn[i]; k.leader && k.err == nil && k.res.Acquired {
			async(run) // runs the operation: takes a slot of concurrency
		} else {
			// A leader whose claim was not acquired only answers and lands
			// its flight, at once (a stale flight would answer later calls
			// of its key in this process); followers only wait (for their
			// flight's claim, or its outcome). Neither takes a slot: a slot
			// held by a waiting follower could be the one its leader needs.
			wg.Go(run)
		}
	}
	return results, errs
}
