package store

import "time"

// Clock is the source of time of the engine (idem.Config.Clock) and of the
// stores' background work (reapers, sweepers). Every timestamp the engine
// writes, every expiry and lease decision, every wait and every lease
// renewal goes through it, so tests can control time (or run under
// testing/synctest with [SystemClock]).
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After waits for d to elapse and then sends the current time.
	After(d time.Duration) <-chan time.Time
	// AfterFunc calls f in its own goroutine after d; Stop cancels it.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending [Clock.AfterFunc] call.
type Timer interface {
	// Stop prevents the call if it has not started, and reports whether it
	// did.
	Stop() bool
}

// SystemClock is the real clock, from package time.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// AfterFunc returns time.AfterFunc(d, f).
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
