package clocktest

import (
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// Skewed is the system clock with its wall reading shifted by an offset
// the test may change: a machine whose wall clock is off (an NTP step, a
// VM resumed from suspend) while its monotonic clock runs true. Now is
// time.Now().Add(offset), which keeps the monotonic reading, so elapsed
// time measured between two readings is real; [Skewed.Step] moves the
// wall reading only, as a real step does. Under testing/synctest, whose
// times carry no monotonic reading, a step reads as time passing.
type Skewed struct{ off atomic.Int64 }

// NewSkewed returns the system clock shifted by off (positive: ahead).
func NewSkewed(off time.Duration) *Skewed {
	s := &Skewed{}
	s.off.Store(int64(off))
	return s
}

// Step moves the wall reading by d (the clock is then off by Offset()+d).
func (s *Skewed) Step(d time.Duration) { s.off.Add(int64(d)) }

// Offset returns how far the clock is off the system clock.
func (s *Skewed) Offset() time.Duration { return time.Duration(s.off.Load()) }

// Now implements store.Clock.
func (s *Skewed) Now() time.Time { return time.Now().Add(s.Offset()) }

// After implements store.Clock: durations are real.
func (s *Skewed) After(d time.Duration) <-chan time.Time { return time.After(d) }

// AfterFunc implements store.Clock: durations are real.
func (s *Skewed) AfterFunc(d time.Duration, f func()) store.Timer { return time.AfterFunc(d, f) }
