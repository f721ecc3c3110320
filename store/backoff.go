package store

import (
	"math/rand/v2"
	"time"
)

// Backoff is capped exponential backoff with jitter, for the loops that
// retry a store call (the engine's outcome writes and waits, opening a
// store): each pause is the current step jittered down to half of it, and
// the step doubles up to Max. The zero value pauses for nothing; set Step
// to the first step.
type Backoff struct {
	Step, Max time.Duration
}

// Pause returns the next pause and doubles the step after it, up to Max.
func (b *Backoff) Pause() time.Duration {
	d := b.Step/2 + rand.N(b.Step/2+1)
	b.Step = min(b.Step*2, b.Max)
	return d
}
