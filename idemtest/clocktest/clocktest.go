// Package clocktest provides a manual store.Clock for tests: time moves only
// when the test calls Advance.
package clocktest

import (
	"sort"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// Clock is a manual clock. The zero value is not usable; call New.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*waiter
}

type waiter struct {
	at    time.Time
	ch    chan time.Time
	fn    func()
	fired bool
	c     *Clock
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now implements store.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After implements store.Clock.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.add(&waiter{ch: ch}, d)
	return ch
}

// AfterFunc implements store.Clock.
func (c *Clock) AfterFunc(d time.Duration, f func()) store.Timer {
	w := &waiter{fn: f}
	c.add(w, d)
	return w
}

func (c *Clock) add(w *waiter, d time.Duration) {
	c.mu.Lock()
	w.c = c
	w.at = c.now.Add(d)
	if d <= 0 {
		c.mu.Unlock()
		c.fire(w, w.at)
		return
	}
	c.waiters = append(c.waiters, w)
	c.mu.Unlock()
}

// Stop implements store.Timer.
func (w *waiter) Stop() bool {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	for i, x := range w.c.waiters {
		if x == w {
			w.c.waiters = append(w.c.waiters[:i], w.c.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// Waiters returns how many timers are pending.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// Advance moves time forward by d and fires every timer that falls due, in
// order. AfterFunc callbacks run synchronously, one after another, so a
// test knows they have finished when Advance returns.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.waiters, func(i, j int) bool { return c.waiters[i].at.Before(c.waiters[j].at) })
		if len(c.waiters) == 0 || c.waiters[0].at.After(target) {
			c.now = target
			c.mu.Unlock()
			return
		}
		w := c.waiters[0]
		c.waiters = c.waiters[1:]
		if w.at.After(c.now) {
			c.now = w.at
		}
		at := c.now
		c.mu.Unlock()
		c.fire(w, at)
	}
}

func (c *Clock) fire(w *waiter, at time.Time) {
	if w.fired {
		return
	}
	w.fired = true
	if w.ch != nil {
		w.ch <- at
	}
	if w.fn != nil {
		w.fn()
	}
}
