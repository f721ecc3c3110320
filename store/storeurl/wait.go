package storeurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// WaitOptions configure [OpenWait] and [StartOpen].
type WaitOptions struct {
	// Wait is how long to keep trying to open the store, counted from the
	// first attempt. Zero makes one attempt.
	Wait time.Duration
	// Backoff is the pause after the first failed attempt; it doubles up
	// to MaxBackoff, each pause jittered down to half. Defaults 250ms and
	// 5s.
	Backoff, MaxBackoff time.Duration
	// AttemptTimeout bounds one attempt (connecting, migrating, checking),
	// and is cut to what is left of Wait. Default 15s.
	AttemptTimeout time.Duration
	// OnRetry, when set, is called after each failed attempt that will be
	// retried, before the pause.
	OnRetry func(Retry)
	// Clock measures Wait and the pauses. Default store.SystemClock.
	Clock store.Clock

	// open replaces Open, for tests.
	open func(ctx context.Context) (*Opened, error)
}

// Retry describes a failed attempt that [OpenWait] will retry.
type Retry struct {
	// Attempt counts the attempts made, from 1.
	Attempt int
	// Err is why this one failed.
	Err error
	// Next is the pause before the next attempt; Left is what remains of
	// WaitOptions.Wait after it.
	Next, Left time.Duration
}

// WaitError is [OpenWait]'s error when the store did not open within
// WaitOptions.Wait. It wraps the last attempt's error.
type WaitError struct {
	// URL is the store URL, its password hidden.
	URL string
	// Wait is WaitOptions.Wait; Attempts the attempts made.
	Wait     time.Duration
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("store %s did not open within %v (%d attempts); last error: %v", e.URL, e.Wait, e.Attempts, e.Err)
}

func (e *WaitError) Unwrap() error { return e.Err }

// Retryable reports whether [OpenWait] retries an [Open] that failed with
// err: anything but a configuration fault (store.ErrInvalidConfig: a
// malformed URL, a missing privilege, a table of the wrong shape), which
// no wait mends, and a cancelled context.
func Retryable(err error) bool {
	return !errors.Is(err, store.ErrInvalidConfig) && !errors.Is(err, context.Canceled)
}

// OpenWait opens the store raw names as [Open] does, retrying with capped,
// jittered exponential backoff while the failure may heal (the server is
// down, not answering, starting, or a migration failed midway; see
// [Retryable]), for at most w.Wait. A configuration fault fails at once
// with Open's error; a store that did not open in time fails with a
// [*WaitError]. It is for commands that start with their store, or before
// it (a fleet restarted during an outage): run it in the background with
// [StartOpen] to serve health and readiness meanwhile.
func OpenWait(ctx context.Context, raw string, o *Options, w WaitOptions) (*Opened, error) {
	return openWait(ctx, raw, o, w, nil)
}

func openWait(ctx context.Context, raw string, o *Options, w WaitOptions, attempted func(n int, err error)) (*Opened, error) {
	if w.Backoff <= 0 {
		w.Backoff = 250 * time.Millisecond
	}
	if w.MaxBackoff <= 0 {
		w.MaxBackoff = 5 * time.Second
	}
	if w.AttemptTimeout <= 0 {
		w.AttemptTimeout = 15 * time.Second
	}
	if w.Clock == nil {
		w.Clock = store.SystemClock{}
	}
	if w.open == nil {
		w.open = func(ctx context.Context) (*Opened, error) { return Open(ctx, raw, o) }
	}
	deadline := w.Clock.Now().Add(w.Wait)
	backoff := store.Backoff{Step: w.Backoff, Max: w.MaxBackoff}
	for n := 1; ; n++ {
		s, err := w.attempt(ctx, deadline)
		if attempted != nil {
			attempted(n, err)
		}
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("opening store %s: %w (after %d attempts; last error: %w)", Redact(raw), ctx.Err(), n, err)
		}
		if !Retryable(err) {
			return nil, err
		}
		pause := backoff.Pause()
		left := deadline.Sub(w.Clock.Now())
		if left <= pause {
			return nil, &WaitError{URL: Redact(raw), Wait: w.Wait, Attempts: n, Err: err}
		}
		if w.OnRetry != nil {
			w.OnRetry(Retry{Attempt: n, Err: err, Next: pause, Left: left - pause})
		}
		select {
		case <-w.Clock.After(pause):
		case <-ctx.Done():
			return nil, fmt.Errorf("opening store %s: %w (after %d attempts; last error: %w)", Redact(raw), ctx.Err(), n, err)
		}
	}
}

// attempt makes one Open, bounded by AttemptTimeout and the deadline (real
// time: package context knows no other clock).
func (w *WaitOptions) attempt(ctx context.Context, deadline time.Time) (*Opened, error) {
	d := min(w.AttemptTimeout, deadline.Sub(w.Clock.Now()))
	if d < time.Second {
		d = time.Second // the last attempt gets a fair chance
	}
	actx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return w.open(actx)
}

// Redact hides the password of a store URL, for logs and errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// Opening is a store being opened in the background by [StartOpen].
type Opening struct {
	done   chan struct{}
	cancel context.CancelFunc

	mu       sync.Mutex
	attempts int
	last     error // the last attempt's error, nil once open
	started  time.Time
	s        *Opened
	err      error
}

// OpeningStatus is what an [Opening] reports while it waits, for a
// readiness endpoint.
type OpeningStatus struct {
	// Ready is true once the store is open; Done once OpenWait returned,
	// opened or not (Err then says why not).
	Ready, Done bool
	// Attempts counts the attempts made so far.
	Attempts int
	// Err is the last attempt's error, or OpenWait's once Done.
	Err error
	// Since is when the opening started.
	Since time.Time
}

// StartOpen runs [OpenWait] in its own goroutine and returns at once:
// Status reports how far it got (a readiness endpoint answers with it),
// Done is closed when it returned and Result has its answer. Close stops
// it and closes the store if it opened.
func StartOpen(ctx context.Context, raw string, o *Options, w WaitOptions) *Opening {
	ctx, cancel := context.WithCancel(ctx)
	clock := w.Clock
	if clock == nil {
		clock = store.SystemClock{}
	}
	p := &Opening{done: make(chan struct{}), cancel: cancel, started: clock.Now()}
	go func() {
		defer close(p.done)
		s, err := openWait(ctx, raw, o, w, func(n int, err error) {
			p.mu.Lock()
			p.attempts, p.last = n, err
			p.mu.Unlock()
		})
		p.mu.Lock()
		p.s, p.err = s, err
		p.mu.Unlock()
	}()
	return p
}

// Done is closed once the opening is over, the store open or not.
func (p *Opening) Done() <-chan struct{} { return p.done }

// Result waits for the opening to be over and returns the store, or
// OpenWait's error.
func (p *Opening) Result() (*Opened, error) {
	<-p.done
	return p.s, p.err
}

// Status reports how the opening is going.
func (p *Opening) Status() OpeningStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := OpeningStatus{Attempts: p.attempts, Err: p.last, Since: p.started}
	select {
	case <-p.done:
		st.Done, st.Ready, st.Err = true, p.s != nil, p.err
	default:
	}
	return st
}

// Close stops an opening still under way, waits for it, and closes the
// store if it opened.
func (p *Opening) Close() error {
	p.cancel()
	s, _ := p.Result()
	return s.Close()
}
