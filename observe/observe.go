// Package observe is what the engine tells an observer — a metrics
// exporter (idemprom, idemotel) or a test — about every call: its
// outcomes, and each store call with its latency and result; and, to an
// observer that also implements [Tracer] (idemotel's), a span per call.
// Users of the engine set Config.Observer; observer authors implement
// [Observer], and [Tracer] to trace.
package observe

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// Outcome is what happened to one call, or to one of its store writes.
type Outcome int

// The outcomes an [Observer] is told about.
const (
	// OutcomeAcquired: the call claimed the key and ran the operation.
	OutcomeAcquired Outcome = iota
	// OutcomeTakeover: the claim took over a record whose lease had passed
	// (counted in addition to OutcomeAcquired).
	OutcomeTakeover
	// OutcomeReplayed: a stored result or terminal error was replayed.
	OutcomeReplayed
	// OutcomeCacheHit: a result was replayed from the local cache, with no
	// store call (counted instead of OutcomeReplayed).
	OutcomeCacheHit
	// OutcomeInProgress: the call met a live claim and returned
	// [github.com/seed-a1b882c0/idem.ErrInProgress].
	OutcomeInProgress
	// OutcomeMismatch: the key was reused with another payload.
	OutcomeMismatch
	// OutcomeFenced: a fenced write (complete, fail, release, extend) was
	// refused because another caller had taken the key over.
	OutcomeFenced
	// OutcomeStoreError: a store call failed.
	OutcomeStoreError
	// OutcomeCompleteFailed: the operation succeeded but its outcome could
	// not be recorded; the caller still got the result.
	OutcomeCompleteFailed
	// OutcomeFailed: a terminal error was stored.
	OutcomeFailed
	// OutcomeReleased: the operation failed with a retryable error or
	// panicked, and the claim was released.
	OutcomeReleased
	// OutcomeUnprotected: the operation ran without a claim, because the
	// engine is disabled or because the store failed and FailOpen is set.
	OutcomeUnprotected
	// OutcomeUncertain: the operation returned an error marked by [github.com/seed-a1b882c0/idem.Uncertain]; its
	// claim was kept until the lease ends.
	OutcomeUncertain
	// OutcomeWriteRetried: an outcome write (complete, fail, release)
	// failed on a transient fault and is tried again, once per retry.
	OutcomeWriteRetried
	// OutcomeHandedOff: the operation handed its claim to other work
	// ([github.com/seed-a1b882c0/idem.Detach]); the engine recorded no outcome for it.
	OutcomeHandedOff
	// OutcomeHeld: the call met a claim held for an operator (the takeover
	// policy Hold, its holder's lease passed) and returned
	// [github.com/seed-a1b882c0/idem.ErrHeld].
	OutcomeHeld
	numOutcomes
)

var outcomeNames = [...]string{
	"acquired", "takeover", "replayed", "cache_hit", "in_progress", "mismatch",
	"fenced", "store_error", "complete_failed", "failed", "released", "unprotected",
	"uncertain", "write_retried", "handed_off", "held",
}

// String returns the outcome's metric label, such as "replayed".
func (o Outcome) String() string {
	if o < 0 || o >= numOutcomes {
		return "unknown"
	}
	return outcomeNames[o]
}

// Outcomes lists every outcome, for exporters that pre-register labels.
func Outcomes() []Outcome {
	out := make([]Outcome, numOutcomes)
	for i := range out {
		out[i] = Outcome(i)
	}
	return out
}

// Observer is told about every outcome and every store call's latency. Its
// methods are called on the call's goroutine and must be fast and safe for
// concurrent use.
type Observer interface {
	// Observe counts one outcome of a call in the named operation.
	Observe(op string, o Outcome)
	// StoreCall reports one store call: its operation ([StoreClaim],
	// [StoreComplete], ...), its duration and its error.
	StoreCall(op StoreOp, d time.Duration, err error)
}

// Counters is an [Observer] that counts outcomes and store calls in memory.
// The zero value is ready to use.
type Counters struct {
	outcomes   [numOutcomes]atomic.Uint64
	storeCalls atomic.Uint64
	storeErrs  atomic.Uint64
	storeNanos atomic.Int64
}

// Observe implements [Observer].
func (c *Counters) Observe(_ string, o Outcome) {
	if o >= 0 && o < numOutcomes {
		c.outcomes[o].Add(1)
	}
}

// StoreCall implements [Observer].
func (c *Counters) StoreCall(_ StoreOp, d time.Duration, err error) {
	c.storeCalls.Add(1)
	c.storeNanos.Add(int64(d))
	if err != nil {
		c.storeErrs.Add(1)
	}
}

// Count returns how many times o was observed.
func (c *Counters) Count(o Outcome) uint64 {
	if o < 0 || o >= numOutcomes {
		return 0
	}
	return c.outcomes[o].Load()
}

// StoreCalls returns the number of store calls and how many failed.
func (c *Counters) StoreCalls() (calls, failed uint64) {
	return c.storeCalls.Load(), c.storeErrs.Load()
}

// Snapshot returns the outcome counts by label, omitting zeros.
func (c *Counters) Snapshot() map[string]uint64 {
	m := make(map[string]uint64)
	for i := range c.outcomes {
		if n := c.outcomes[i].Load(); n > 0 {
			m[Outcome(i).String()] = n
		}
	}
	return m
}

// StoreOp names a store operation, as [Observer.StoreCall] and
// [github.com/seed-a1b882c0/idem.StoreError] reports it; its string is the metric label.
type StoreOp string

// The store operations the engine makes.
const (
	StoreClaim    StoreOp = "claim"
	StoreComplete StoreOp = "complete"
	StoreFail     StoreOp = "fail"
	StoreRelease  StoreOp = "release"
	StoreExtend   StoreOp = "extend"
	// StoreAttach is an Extend that attaches an execution reference
	// ([github.com/seed-a1b882c0/idem.Engine.Attach]).
	StoreAttach StoreOp = "attach"
	// StoreGet is a read of one record ([github.com/seed-a1b882c0/idem.Engine.Status]).
	StoreGet StoreOp = "get"
	// StoreClaimBatch is one round trip claiming a batch of keys
	// ([github.com/seed-a1b882c0/idem.DoBatch] over a [store.BatchClaimer]).
	StoreClaimBatch StoreOp = "claim_batch"
	// StoreStep records a finished step under the claim
	// ([github.com/seed-a1b882c0/idem.Step] over a [store.Stepper]).
	StoreStep StoreOp = "step"
)

// StoreOps lists every store operation the engine reports, for exporters
// that index by it.
func StoreOps() []StoreOp {
	return []StoreOp{StoreClaim, StoreComplete, StoreFail, StoreRelease, StoreExtend, StoreAttach, StoreGet, StoreClaimBatch, StoreStep}
}

// StoreResult classifies the result of one store call for metrics: a small
// fixed set of labels, one per error of the store contract, so that an
// exporter never labels by an error's text. [StoreResultOf] computes it.
type StoreResult string

// The results of a store call, from [StoreResultOf].
const (
	// StoreOK: the call succeeded.
	StoreOK StoreResult = "ok"
	// StoreNotFound: the record was absent or expired ([store.ErrNotFound]).
	StoreNotFound StoreResult = "not_found"
	// StoreFenced: a write was refused because the record no longer holds
	// the writer's claim ([store.ErrFenced]).
	StoreFenced StoreResult = "fenced"
	// StoreTooLarge: the record was over the store's size limit
	// ([store.ErrTooLarge]).
	StoreTooLarge StoreResult = "too_large"
	// StoreCorrupt: stored bytes could not be decoded ([store.ErrCorrupt]).
	StoreCorrupt StoreResult = "corrupt"
	// StoreCanceled: the caller's context was cancelled while the call ran
	// ([context.Canceled]); the caller gave up, which says nothing of the
	// store's health.
	StoreCanceled StoreResult = "canceled"
	// StoreThrottled: the backend refused the call for the rate of
	// requests, after the client's own retries ([store.ErrThrottled]:
	// also unavailable, counted apart).
	StoreThrottled StoreResult = "throttled"
	// StoreUnavailable: the backend could not be reached or did not answer
	// in time ([store.ErrUnavailable], or [context.DeadlineExceeded]).
	StoreUnavailable StoreResult = "unavailable"
	// StoreOtherError: any other error, such as one from a store that does
	// not translate its backend's errors.
	StoreOtherError StoreResult = "other"
)

// StoreResults lists every [StoreResult], for exporters that pre-register
// labels.
func StoreResults() []StoreResult {
	return []StoreResult{StoreOK, StoreNotFound, StoreFenced, StoreTooLarge, StoreCorrupt, StoreCanceled, StoreThrottled, StoreUnavailable, StoreOtherError}
}

// StoreResultOf classifies err, the error of one store call as
// [Observer.StoreCall] receives it: [StoreOK] for nil, else the first class
// in the order of the constants above that err matches with [errors.Is]. A
// cancelled context is "canceled" even when the store wrapped it with
// [store.ErrUnavailable], as stores do with their backend's errors.
func StoreResultOf(err error) StoreResult {
	switch {
	case err == nil:
		return StoreOK
	case errors.Is(err, store.ErrNotFound):
		return StoreNotFound
	case errors.Is(err, store.ErrFenced):
		return StoreFenced
	case errors.Is(err, store.ErrTooLarge):
		return StoreTooLarge
	case errors.Is(err, store.ErrCorrupt):
		return StoreCorrupt
	case errors.Is(err, context.Canceled):
		return StoreCanceled
	case errors.Is(err, store.ErrThrottled):
		return StoreThrottled
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return StoreUnavailable
	}
	return StoreOtherError
}
