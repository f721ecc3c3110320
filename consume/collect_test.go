package consume_test

import (
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
)

// Collect takes a batch when it is full (at once, with no timer, when the
// channel holds it already), when its window has passed on the injected
// clock since the first message, or when the messages end.
func TestCollect(t *testing.T) {
	t.Parallel()
	const window = 5 * time.Millisecond
	start := func(ds chan string, size int, clock *clocktest.Clock) <-chan []string {
		out := make(chan []string, 1)
		go func() { out <- consume.Collect(ds, size, window, clock) }()
		return out
	}
	// whole checks that b is the first n of a, b, c, … and that no timer
	// was left behind for it.
	whole := func(t *testing.T, b []string, n int, clock *clocktest.Clock) {
		t.Helper()
		if len(b) != n || b[0] != "a" || b[n-1] != string(rune('a'+n-1)) {
			t.Fatalf("batch %v, want the first %d", b, n)
		}
		if w := clock.Waiters(); w != 0 {
			t.Fatalf("%d timers left behind", w)
		}
	}
	t.Run("full", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan string)
		out := start(ds, 3, clock)
		for i := range 3 {
			ds <- string(rune('a' + i))
		}
		whole(t, <-out, 3, clock)
	})
	t.Run("window", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan string) // unbuffered: a send returns once Collect took it
		out := start(ds, 10, clock)
		ds <- "a"
		ds <- "b" // the window's timer is set by now
		clock.Advance(window - time.Millisecond)
		ds <- "c"
		select {
		case b := <-out:
			t.Fatalf("batch %v before the window passed", b)
		default:
		}
		clock.Advance(time.Millisecond)
		if b := <-out; len(b) != 3 {
			t.Fatalf("batch of %d, want the 3 that came within the window", len(b))
		}
	})
	t.Run("held", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan string, 5)
		for i := range 5 {
			ds <- string(rune('a' + i))
		}
		whole(t, <-start(ds, 4, clock), 4, clock) // the 4 the channel held at once
	})
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan string, 2)
		ds <- "a"
		close(ds)
		if b := <-start(ds, 10, clock); len(b) != 1 {
			t.Fatalf("batch of %d, want the 1 before the close", len(b))
		}
		if b := <-start(ds, 10, clock); len(b) != 0 {
			t.Fatalf("batch of %d after the close, want none", len(b))
		}
	})
}
