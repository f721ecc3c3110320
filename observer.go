// The observer: outcomes, store calls and events reported to
// observe.Observer, and the one an engine without one uses.

package idem

import (
	"time"

	"github.com/seed-a1b882c0/idem/observe"
)

// nopObserver is the Observer of an engine configured without one.
type nopObserver struct{}

func (nopObserver) Observe(string, observe.Outcome)                 {}
func (nopObserver) StoreCall(observe.StoreOp, time.Duration, error) {}
