package idemamqp

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
)

// collect takes a batch when it is full (at once, with no timer, when the
// channel holds it already), when its window has passed on the injected
// clock since the first delivery, or when the deliveries end.
func TestCollect(t *testing.T) {
	t.Parallel()
	const window = 5 * time.Millisecond
	start := func(ds chan amqp.Delivery, size int, clock *clocktest.Clock) <-chan []amqp.Delivery {
		out := make(chan []amqp.Delivery, 1)
		go func() { out <- collect(ds, size, window, clock) }()
		return out
	}
	t.Run("full", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan amqp.Delivery)
		out := start(ds, 3, clock)
		for i := range 3 {
			ds <- amqp.Delivery{MessageId: string(rune('a' + i))}
		}
		if b := <-out; len(b) != 3 || b[0].MessageId != "a" || b[2].MessageId != "c" {
			t.Fatalf("batch %v, want a, b, c", b)
		}
		if n := clock.Waiters(); n != 0 {
			t.Fatalf("%d timers left behind", n)
		}
	})
	t.Run("window", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan amqp.Delivery) // unbuffered: a send returns once collect took it
		out := start(ds, 10, clock)
		ds <- amqp.Delivery{MessageId: "a"}
		ds <- amqp.Delivery{MessageId: "b"} // the window's timer is set by now
		clock.Advance(window - time.Millisecond)
		ds <- amqp.Delivery{MessageId: "c"}
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
		ds := make(chan amqp.Delivery, 5)
		for i := range 5 {
			ds <- amqp.Delivery{MessageId: string(rune('a' + i))}
		}
		if b := <-start(ds, 4, clock); len(b) != 4 || b[3].MessageId != "d" {
			t.Fatalf("batch %v, want the 4 the channel held at once", b)
		}
		if n := clock.Waiters(); n != 0 {
			t.Fatalf("%d timers for a batch the channel filled at once", n)
		}
	})
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		clock := clocktest.New(time.Unix(0, 0))
		ds := make(chan amqp.Delivery, 2)
		ds <- amqp.Delivery{MessageId: "a"}
		close(ds)
		if b := <-start(ds, 10, clock); len(b) != 1 {
			t.Fatalf("batch of %d, want the 1 before the close", len(b))
		}
		if b := <-start(ds, 10, clock); len(b) != 0 {
			t.Fatalf("batch of %d after the close, want none", len(b))
		}
	})
}
