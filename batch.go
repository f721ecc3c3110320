package idem

import (
	"context"
	"sync"
	"time"

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

	calls := make([]*typedCall[T], n)
	type follower struct {
		i int
		f *flight
	}
	var (
		leaders   []int // calls that lead their key's flight, to claim
		params    []store.ClaimParams
		followers []follower // calls whose key is in flight already, in this batch or elsewhere
		rest      []int      // calls to run as DoIdentity would
	)
	now, lease, lerr := e.leaseFor(ctx)
	keep := e.cache != nil && cacheable[T]()
	var deadline time.Time
	if e.cfg.Wait > 0 {
		deadline = now.Add(e.cfg.Wait)
	}
	for i, id := range ids {
		t := &typedCall[T]{fn: func(ctx context.Context) (T, error) { return fn(ctx, i) }, keep: keep}
		t.call = call{e: e, key: id.StoreKey.String(), name: id.StoreKey.Operation, fingerprint: id.Fingerprint, op: t}
		calls[i] = t
		if e.tracer != nil {
			t.startSpan(ctx, observe.CallDo, observe.TraceContext{})
			sp := t.span
			t.fn = func(ctx context.Context) (T, error) { return fn(sp.Context(ctx), i) }
		}
		if e.cache != nil {
			if ent, ok := e.cache.get(t.key, store.Millis(now)); ok {
				err := t.mismatch(ent.fingerprint)
				if err == nil {
					t.observe(observe.OutcomeCacheHit)
				}
				results[i], errs[i] = t.result(ctx, outcome{replayed: true, result: ent.result, value: ent.value}, err)
				continue
			}
		}
		if lerr != nil {
			results[i], errs[i] = t.result(ctx, outcome{}, lerr)
			continue
		}
		t.flUsed = true
		if f, leader := e.join(t.key, &t.fl); !leader {
			followers = append(followers, follower{i, f})
			continue
		}
		leaders = append(leaders, i)
		params = append(params, t.claimParams(ctx, now, lease, true))
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
		claims := make([]store.ClaimResult, len(leaders))
		for j, i := range leaders {
			t := calls[i]
			r, err := t.claimAnswer(res[j], cerrs[j])
			claims[j], cerrs[j] = r, err
			if err == nil && r.Acquired {
				tell(&t.fl, r)
			}
		}
		for j, i := range leaders {
			t := calls[i]
			r, err := claims[j], cerrs[j]
			if err != nil || !r.Acquired {
				out, err := t.claimed(ctx, &t.fl, now, lease, r, err)
				if _, busy := asInProgress(err); busy {
					if e.cfg.Wait > 0 {
						rest = append(rest, i) // waits, as DoIdentity does
						continue
					}
					t.observe(observe.OutcomeInProgress)
				}
				results[i], errs[i] = t.result(ctx, out, err)
				continue
			}
			async(func() {
				out, err := t.acquired(ctx, &t.fl, now, lease, r)
				results[i], errs[i] = t.result(ctx, out, err)
			})
		}
	}
	// Followers only wait (for their flight's claim, or its outcome), so
	// they take no slot: a slot held by a waiting follower could be the
	// one its leader needs.
	for _, fo := range followers {
		t := calls[fo.i]
		wg.Go(func() {
			out, retry, err := t.follow(ctx, fo.f, deadline)
			_, busy := asInProgress(err)
			switch {
			case retry, busy && e.cfg.Wait > 0 && !fo.f.acquired:
				// Released, or held by another process (the flight's leader
				// only saw it): go round as DoIdentity does.
				out, err = t.run(ctx)
			case busy:
				t.observe(observe.OutcomeInProgress)
			}
			results[fo.i], errs[fo.i] = t.result(ctx, out, err)
		})
	}
	for _, i := range rest {
		t := calls[i]
		async(func() {
			out, err := t.run(ctx)
			results[i], errs[i] = t.result(ctx, out, err)
		})
	}
	return results, errs
}
