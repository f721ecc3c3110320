// The engine: Engine, New and Result, the owner of each claim, and the
// timing of store calls for the observer.

package idem

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
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

	timing   bool           // the observer wants store-call latencies
	tracer   observe.Tracer // the observer traces: nil when it does not
	dbSystem string         // the store's store.SystemNamer name, for its spans
	raw      bool           // the codec is JSONCodec: []byte and json.RawMessage results skip it
	sysClock bool           // the clock is store.SystemClock
	// clock is the engine's clock corrected to the store's (and cfg.Clock
	// is it, inside the engine; Config returns the configured one), when
	// the engine measures the store's clock; nil otherwise.
	clock *storeClock

	// completer batches the Completes of calls that finish together, when
	// the store can (store.BatchCompleter); nil otherwise.
	completer *completer
	// workers run the items of batches (DoBatch).
	workers workers

	mu       sync.Mutex
	flights  map[string]*flight
	renewals renewals
}

// New returns an engine over s. A nil cfg means all defaults. It fails
// with [ErrInvalidConfig] when a field is out of range, saying which.
func New(s store.Store, cfg *Config) (*Engine, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	e := &Engine{store: s, cfg: c, ownerPrefix: c.Owner + "/" + randomID(), flights: make(map[string]*flight)}
	_, nop := c.Observer.(nopObserver)
	switch c.Codec.(type) {
	case JSONCodec: // []byte and json.RawMessage results are stored as they are
		e.raw = true
	}
	_, e.sysClock = c.Clock.(store.SystemClock)
	e.timing = !nop
	e.tracer, _ = c.Observer.(observe.Tracer)
	if sn, ok := s.(store.SystemNamer); ok {
		e.dbSystem = sn.SystemName()
	}
	if ts, ok := s.(store.ServerTimer); ok && c.ClockSync > 0 && !c.Disabled {
		e.clock = newStoreClock(c.Clock, ts, &c)
		e.cfg.Clock = e.clock
	}
	e.renewals.init(e)
	if bc, ok := s.(store.BatchCompleter); ok {
		// An attempt as a holder's own, with the engine's lease.
		e.completer = &completer{s: s, b: bc, attempt: writeAttempt(c.WriteTimeout, c.Lease)}
	}
	if c.CacheEntries > 0 {
		e.cache = newLRU(c.CacheEntries, c.CacheBytes)
	}
	if c.Disabled {
		c.Logger.Warn("idem: idempotency is DISABLED; every operation runs unprotected",
			"env", envDisabled)
	}
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.store }

// Config returns the engine's configuration as given to [New], with
// defaults filled in. Its Clock is the configured clock, not corrected to
// the store's: read the engine's time with [Engine.Now].
func (e *Engine) Config() Config {
	c := e.cfg
	if e.clock != nil {
		c.Clock = e.clock.base
	}
	return c
}

// Now returns the engine's time: its clock corrected to the store's when it
// measures the store's clock (Config.ClockSync), the configured clock
// otherwise. Every lease and expiry the engine writes and compares is on
// this time, so an adapter computing a Retry-After, a redelivery delay or
// a consumer's verdict reads it here. It allocates nothing.
func (e *Engine) Now() time.Time { return e.cfg.Clock.Now() }

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
	// Unrecorded is the store's last answer when this call ran the
	// operation but its outcome write (the Complete or Fail, or the
	// Release of a retryable error) did not land, after the engine's
	// retries: an error matching store.ErrFenced or store.ErrNotFound when
	// the key was taken over meanwhile (the write was refused), or
	// store.ErrUnavailable when the store failed for all of WriteTimeout.
	// Nil otherwise. The consumers' verdict (package consume) reads it.
	Unrecorded error
}

// owner returns a claim owner unique to this call: the engine's owner
// prefix (the configured owner and a random instance id) and a sequence
// number. Stores check it on every fenced write, so it must never repeat.
//
// A label given with [WithOwnerLabel] ends it, after another '/'.
func (e *Engine) owner(ctx context.Context) string {
	var b [24]byte
	seq := strconv.AppendUint(b[:0], e.seq.Add(1), 10)
	by, _ := ctx.Value(ownerLabelKey{}).(string)
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

// callStart returns when a store call starts, for its latency: now when
// the caller has read the clock already, and nothing when no observer
// wants latencies.
func (e *Engine) callStart(now time.Time) time.Time {
	if !e.timing || !now.IsZero() {
		return now
	}
	return e.cfg.Clock.Now()
}

// callEnd reports a store call's latency to the observer.
func (e *Engine) callEnd(op observe.StoreOp, start time.Time, err error) {
	if e.timing {
		e.cfg.Observer.StoreCall(op, e.cfg.Clock.Now().Sub(start), err)
	}
}

// timed runs one store call and reports its latency to the observer.
func (e *Engine) timed(op observe.StoreOp, call func() error) error {
	start := e.callStart(time.Time{})
	err := call()
	e.callEnd(op, start, err)
	return err
}

// realNow returns now (from the engine's clock) on the real clock, for
// context deadlines, which package context keeps in real time. A clock
// corrected to the store's is not the real clock.
func (e *Engine) realNow(now time.Time) time.Time {
	if e.sysClock && e.clock == nil {
		return now
	}
	return time.Now()
}
