package idemhttp_test

import (
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemhttp"
)

// Retry-After is whole seconds, rounded up, never 0.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "1", time.Millisecond: "1", time.Second: "1", 1200 * time.Millisecond: "2", 5 * time.Minute: "300", -time.Second: "1",
	} {
		if got := idemhttp.RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %q, want %q", d, got, want)
		}
	}
}
