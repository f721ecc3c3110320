package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// ServerClockInterval is how long a [ServerClock]'s measurement stands
// before [ServerClock.Sync] measures again: the engine's default
// (idem.Config.ClockSync).
const ServerClockInterval = 10 * time.Second

// ServerClock is a [Clock] corrected to a store's own clock, for the code
// that judges records without an engine: the monitor, the operator console
// and idemctl decide that an IN_PROGRESS record is stuck (its lease has
// passed), how old it is and when it expires by it, as the engine decides
// leases by its clock corrected to the store's. A host whose clock runs
// ahead then does not list live work as stuck, and one whose clock runs
// behind still lists work whose lease has passed.
//
// [ServerClock.Sync] measures the store's clock ([ServerTimer]: one round
// trip) when no measurement younger than [ServerClockInterval] stands;
// Now is then the store's time at the middle of that round trip plus the
// time elapsed since on the process's monotonic clock, so a step of the
// local wall clock changes nothing. Until the first Sync, Now is the base
// clock's.
//
// Two kinds of clock are never corrected, and Now is then the base
// clock's: that of a store that does not tell its time (memstore and
// boltstore run in the caller's process, so the records' holders wrote
// their leases by this machine's clock, or this process's), and a base
// clock that is not real time (its readings carry no monotonic reading: a
// manual test clock, or testing/synctest's), since a test that injected
// such a clock owns time, as with the engine's Config.ClockSync.
//
// After and AfterFunc are the base clock's: durations need no correction.
// A ServerClock is safe for concurrent use.
type ServerClock struct {
	base  Clock
	timer ServerTimer // nil: never corrected
	m     atomic.Pointer[serverMeasure]
	busy  chan struct{} // one measurement at a time
}

// serverMeasure is one reading of the store's clock.
type serverMeasure struct {
	store time.Time // the store's time
	mono  time.Time // time.Now() at the middle of the round trip
}

// NewServerClock returns base corrected to the clock of s, a store or its
// [Lister]: when s is a [ServerTimer] and base tells real time. A nil base
// is [SystemClock]; a base that is a ServerClock already is corrected
// anew from its own base.
func NewServerClock(s any, base Clock) *ServerClock {
	if sc, ok := base.(*ServerClock); ok {
		base = sc.base
	}
	if base == nil {
		base = SystemClock{}
	}
	c := &ServerClock{base: base, busy: make(chan struct{}, 1)}
	if t, ok := s.(ServerTimer); ok {
		if now := base.Now(); now != now.Round(0) { // a monotonic reading: real time
			c.timer = t
		}
	}
	return c
}

// Corrected reports whether Now is corrected to the store's clock (after
// a Sync): the store tells its time and the base clock is real time.
func (c *ServerClock) Corrected() bool { return c.timer != nil }

// Sync measures the store's clock unless a measurement younger than
// [ServerClockInterval] stands, or the clock is never corrected. An error
// (the store's, translated: an unreachable store wraps [ErrUnavailable])
// leaves the last measurement standing, if there is one; a caller that
// judges records must not go on with the base clock's time instead, so
// it reports the error.
func (c *ServerClock) Sync(ctx context.Context) error {
	if c.timer == nil {
		return nil
	}
	if m := c.m.Load(); m != nil && time.Since(m.mono) < ServerClockInterval {
		return nil
	}
	select {
	case c.busy <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("reading the store's clock: %w", ctx.Err())
	}
	defer func() { <-c.busy }()
	if m := c.m.Load(); m != nil && time.Since(m.mono) < ServerClockInterval {
		return nil // measured meanwhile
	}
	r0 := time.Now()
	st, err := c.timer.ServerTime(ctx)
	r1 := time.Now()
	if err != nil {
		return fmt.Errorf("reading the store's clock: %w", err)
	}
	c.m.Store(&serverMeasure{store: st.Round(0), mono: r0.Add(r1.Sub(r0) / 2)})
	return nil
}

// Now implements [Clock]: the store's time, as the last measurement tells
// it; the base clock's until the first, or when never corrected.
func (c *ServerClock) Now() time.Time {
	if m := c.m.Load(); m != nil {
		return m.store.Add(time.Since(m.mono))
	}
	return c.base.Now()
}

// After implements [Clock] with the base clock.
func (c *ServerClock) After(d time.Duration) <-chan time.Time { return c.base.After(d) }

// AfterFunc implements [Clock] with the base clock.
func (c *ServerClock) AfterFunc(d time.Duration, f func()) Timer { return c.base.AfterFunc(d, f) }
