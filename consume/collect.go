package consume

import (
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// Collect takes the next batch of a consumer's messages from in: it waits
// for a first message, takes those that in already holds, and only when
// that is not size yet waits for more, until there are size or wait has
// passed on clock since the first. It returns an empty batch once in is
// closed and drained. Every consumer that collects its broker's
// deliveries into batches ([Batching]) forms them with it, so a batch is
// what the broker has delivered, up to size, and no batch waits longer
// than wait for more once its first message is there.
func Collect[M any](in <-chan M, size int, wait time.Duration, clock store.Clock) []M {
	m, ok := <-in
	if !ok {
		return nil
	}
	first := clock.Now()
	batch := append(make([]M, 0, size), m)
	for len(batch) < size {
		m, ok, ready := take(in)
		switch {
		case !ready:
			return collectFor(batch, in, size, wait-clock.Now().Sub(first), clock)
		case !ok:
			return batch
		}
		batch = append(batch, m)
	}
	return batch
}

// take receives from in if it holds a message (or is closed) now.
func take[M any](in <-chan M) (m M, ok, ready bool) {
	select {
	case m, ok = <-in:
		return m, ok, true
	default:
		return m, false, false
	}
}

// collectFor adds to batch what in brings within left on clock, up to
// size.
func collectFor[M any](batch []M, in <-chan M, size int, left time.Duration, clock store.Clock) []M {
	up := make(chan struct{})
	t := clock.AfterFunc(left, func() { close(up) })
	defer t.Stop()
	for len(batch) < size {
		select {
		case m, ok := <-in:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		case <-up:
			return batch
		}
	}
	return batch
}
