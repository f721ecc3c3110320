// One clock for every lease decision: the engine's clock corrected to its
// store's (Config.ClockSync), and whether the engine may take claims over.

package idem

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// clockTimeout bounds one measurement of the store's clock.
const clockTimeout = 2 * time.Second

// stepLimit is how far the engine clock's wall reading may drift from its
// monotonic reading between two measurements before the engine counts it
// as a step (an NTP step, a machine resumed from suspend) and measures
// again before it takes anything over. NTP slews the clock by 0.5 ms a
// second at most, so a whole second is a step.
const stepLimit = time.Second

// storeClock is the engine's clock corrected to the store's: the store's
// time at the last measurement plus the time elapsed since. When the
// engine's clock is real time (its readings carry a monotonic reading, as
// time.Now's do, even shifted), elapsed time is the process's monotonic
// clock, so a step of the wall clock between measurements changes
// nothing. With a clock whose readings have none (a manual clock, or
// testing/synctest), elapsed time is its own difference: advancing such a
// clock is time passing, on the store too.
//
// Now reads one atomic pointer and allocates nothing; the measurement
// itself is made by sync, on the goroutine of a claim or token write,
// at most once per interval and one at a time.
type storeClock struct {
	base    store.Clock
	timer   store.ServerTimer
	every   time.Duration // Config.ClockSync
	bound   time.Duration // Config.MaxClockOffset
	log     *slog.Logger
	obs     observe.ClockObserver // nil when the observer is not one
	m       atomic.Pointer[clockMeasure]
	retryAt atomic.Int64  // after a failed measurement: base-clock UnixNano before which none is due
	busy    chan struct{} // holds a token while a measurement is in flight (a channel, so waiting for it is durable under synctest)
	trusted bool          // as of the last measurement, for logging the changes; while holding busy
}

// clockMeasure is one measurement of the store's clock, each reading
// taken at the middle of its round trip.
type clockMeasure struct {
	store  time.Time     // the store's time
	local  time.Time     // the engine clock's reading
	mono   time.Time     // the process's clock (time.Now), when real
	real   bool          // the engine's clock is real time: elapsed time is mono's
	offset time.Duration // store minus local, wall clock against wall clock
	rtt    time.Duration
}

// elapsed is the time since m, l being the engine clock's reading now.
func (m *clockMeasure) elapsed(l time.Time) time.Duration {
	if m.real {
		return time.Since(m.mono)
	}
	return l.Sub(m.local)
}

func newStoreClock(base store.Clock, t store.ServerTimer, cfg *Config) *storeClock {
	c := &storeClock{base: base, timer: t, every: cfg.ClockSync, bound: cfg.MaxClockOffset, log: cfg.Logger, trusted: true,
		busy: make(chan struct{}, 1)}
	c.obs, _ = cfg.Observer.(observe.ClockObserver)
	return c
}

// Now implements [store.Clock]: the store's time, as well as the last
// measurement tells it; the engine's own clock until the first one.
func (c *storeClock) Now() time.Time {
	m := c.m.Load()
	switch {
	case m == nil:
		return c.base.Now()
	case m.real:
		return m.store.Add(time.Since(m.mono))
	}
	return m.store.Add(c.base.Now().Sub(m.local))
}

// After implements [store.Clock] with the engine's clock: durations need
// no correction.
func (c *storeClock) After(d time.Duration) <-chan time.Time { return c.base.After(d) }

// AfterFunc implements [store.Clock] with the engine's clock.
func (c *storeClock) AfterFunc(d time.Duration, f func()) store.Timer {
	return c.base.AfterFunc(d, f)
}

// stepped reports whether the engine clock's wall reading and the
// process's monotonic clock have parted by more than stepLimit since m:
// the wall clock stepped, or the monotonic clock stood still while the
// machine was suspended. Either way the correction may be off until the
// store is asked again. A clock that is not real time never steps.
func stepped(m *clockMeasure, l time.Time) bool {
	if !m.real {
		return false
	}
	d := l.Round(0).Sub(m.local.Round(0)) - time.Since(m.mono)
	return d > stepLimit || d < -stepLimit
}

// trustedAt reports whether the engine may take claims over at l (the
// engine clock's reading): its offset to the store is known, no older
// than three intervals, not broken by a step since, and within the bound.
func (c *storeClock) trustedAt(m *clockMeasure, l time.Time) bool {
	return m != nil && m.elapsed(l) < 3*c.every && !stepped(m, l) && m.offset <= c.bound && m.offset >= -c.bound
}

// holdOff reports whether the engine's claims must take nothing over now.
func (c *storeClock) holdOff() bool { return !c.trustedAt(c.m.Load(), c.base.Now()) }

// sync measures the store's clock when a measurement is due: none yet, the
// last one an interval old, or a step since. It is cheap when none is due,
// and only one caller measures at a time. Before the first measurement the
// others wait for it: a claim made on the engine's own clock would write a
// lease that ends early or late on the store's. Later, they go on with the
// last measurement, which stays right while it is fresh. After a failed
// measurement none is made for an interval; claims meanwhile take nothing
// over.
func (c *storeClock) sync(ctx context.Context) {
	l := c.base.Now()
	m := c.m.Load()
	if m != nil && m.elapsed(l) < c.every && !stepped(m, l) {
		return
	}
	if l.UnixNano() < c.retryAt.Load() {
		return
	}
	if m == nil {
		select {
		case c.busy <- struct{}{}:
		case <-ctx.Done():
			return
		}
	} else {
		select {
		case c.busy <- struct{}{}:
		default:
			return
		}
	}
	defer func() { <-c.busy }()
	if l := c.base.Now(); l.UnixNano() < c.retryAt.Load() {
		return // failed meanwhile
	}
	if m2 := c.m.Load(); m2 != m {
		return // measured meanwhile
	}
	c.measure(ctx)
}

// measure asks the store for its time and keeps the measurement; it logs
// and reports it. Called holding busy.
func (c *storeClock) measure(call context.Context) {
	if call.Err() != nil {
		return // the call is over: it asks nothing of the store
	}
	d := clockTimeout
	if dl, ok := call.Deadline(); ok {
		d = min(d, time.Until(dl)/2) // leave the call half of what it has left
	}
	ctx, cancel := context.WithTimeout(call, d)
	defer cancel()
	t0, r0 := c.base.Now(), time.Now()
	st, err := c.timer.ServerTime(ctx)
	t1, r1 := c.base.Now(), time.Now()
	if err != nil && (call.Err() != nil || (d < clockTimeout && ctx.Err() != nil)) {
		// The call ended, or its short deadline cut the measurement off:
		// no fault of the store's. The next call measures again.
		return
	}
	real := t0 != t0.Round(0) // a monotonic reading: real time
	rtt := t1.Sub(t0)
	if real {
		rtt = r1.Sub(r0)
	}
	s := observe.ClockSync{RTT: rtt, Err: err}
	if err != nil {
		c.retryAt.Store(t1.Add(c.every).UnixNano())
		s.Trusted = c.trustedAt(c.m.Load(), t1)
		c.log.Warn("idem: could not read the store's clock; the last measurement stands until it is stale, then no claim is taken over",
			"error", err, "trusted", s.Trusted)
	} else {
		mid := t0.Add(t1.Sub(t0) / 2)
		m := &clockMeasure{store: st, local: mid, mono: r0.Add(r1.Sub(r0) / 2), real: real, offset: st.Round(0).Sub(mid.Round(0)), rtt: rtt}
		c.m.Store(m)
		c.retryAt.Store(0)
		s.Offset, s.Trusted = m.offset, c.trustedAt(m, t1)
		switch {
		case !s.Trusted:
			c.log.Warn("idem: this engine's clock is off the store's by more than MaxClockOffset; timestamps are corrected, but no claim is taken over until it is back within the bound",
				"offset", m.offset, "max", c.bound, "rtt", rtt)
		case !c.trusted:
			c.log.Info("idem: clock offset to the store back within MaxClockOffset; claims are taken over again", "offset", m.offset, "rtt", rtt)
		}
	}
	c.trusted = s.Trusted
	if c.obs != nil {
		c.obs.ClockSync(s)
	}
}

// syncClock measures the store's clock when due (Config.ClockSync): at
// the start of every claim and token write, before it reads the time.
func (e *Engine) syncClock(ctx context.Context) {
	if e.clock != nil {
		e.clock.sync(ctx)
	}
}

// holdOff reports whether a claim made now must take nothing over
// (store.ClaimParams.NoTakeover): the engine measures its store's clock
// and cannot trust the correction.
func (e *Engine) holdOff() bool { return e.clock != nil && e.clock.holdOff() }
