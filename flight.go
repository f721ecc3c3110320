// In-process flights: concurrent duplicates of one key inside one process
// share one claim, led by the first and followed by the rest.

package idem

import (
	"sync"
	"sync/atomic"

	"github.com/seed-a1b882c0/idem/store"
)

// flight lets concurrent duplicates inside one process share one claim.
// Its signals make their channels only when a duplicate waits on them, so
// a call without duplicates pays for none.
type flight struct {
	claimed  signal // fired once the leader's claim has answered
	claimRec *store.Record
	acquired bool
	claimErr error
	// leaseUntil is the claim's lease as last written, renewals included.
	leaseUntil atomic.Int64

	done      signal        // fired once the leader has finished
	final     *store.Record // COMPLETED or FAILED outcome, nil when released
	followers int           // duplicates that joined, under Engine.mu
	// ref is the execution reference the leader attached when it handed
	// its claim off ([Detach]), for the followers' InProgressError.
	ref atomic.Pointer[string]
}

// signal is a one-shot event whose channel is made by the first waiter.
type signal struct {
	mu    sync.Mutex
	fired bool
	ch    chan struct{}
}

// closed is the channel of every signal fired before anyone waited.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// wait returns a channel closed once the signal fires.
func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fired {
		return closed
	}
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// hasFired reports whether the signal has fired.
func (s *signal) hasFired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fired
}

// fire fires the signal; what was written before it is visible to every
// waiter after.
func (s *signal) fire() {
	s.mu.Lock()
	s.fired = true
	if s.ch != nil {
		close(s.ch)
	}
	s.mu.Unlock()
}

// join returns the in-process flight for key: the one in flight (leader =
// false), or f, which becomes the key's flight (leader = true).
func (e *Engine) join(key string, f *flight) (_ *flight, leader bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if g, ok := e.flights[key]; ok {
		g.followers++
		return g, false
	}
	e.flights[key] = f
	return f, true
}

// land ends a flight: later callers start their own. The final record its
// followers replay is built (by final, when not nil) only when there are
// followers.
func (e *Engine) land(key string, f *flight, h *holder) {
	e.mu.Lock()
	delete(e.flights, key)
	followers := f.followers
	e.mu.Unlock()
	if followers > 0 && h != nil {
		f.final = h.final()
	}
	f.done.fire()
}
