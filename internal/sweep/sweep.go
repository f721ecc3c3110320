// Package sweep is the background loop the stores share for deleting
// expired records: every interval on the store's clock, until stop closes.
package sweep

import (
	"time"

	"github.com/seed-a1b882c0/idem"
)

// Loop calls run with the clock's time (ms) every interval until stop is
// closed, then closes done. Run it in its own goroutine.
func Loop(stop <-chan struct{}, done chan<- struct{}, clk idem.Clock, interval time.Duration, run func(now int64)) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-clk.After(interval):
			run(idem.Millis(clk.Now()))
		}
	}
}
