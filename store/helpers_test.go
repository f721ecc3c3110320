package store_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

func TestTakenOver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{store.ErrFenced, true},
		{&store.FencedError{Key: "k", Fence: 1, Current: 2}, true},
		{fmt.Errorf("complete: %w", store.ErrNotFound), true},
		{store.ErrUnavailable, false},
		{errors.Join(store.ErrTooLarge, store.ErrCorrupt), false},
	} {
		if got := store.TakenOver(c.err); got != c.want {
			t.Errorf("TakenOver(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestBackoffPausesWithinHalfToFullStepAndDoublesToMax(t *testing.T) {
	t.Parallel()
	b := store.Backoff{Step: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	for i, step := range []time.Duration{10, 20, 40, 40, 40} {
		step *= time.Millisecond
		if d := b.Pause(); d < step/2 || d > step {
			t.Fatalf("pause %d: %v, want within [%v, %v]", i, d, step/2, step)
		}
	}
	if b.Step != 40*time.Millisecond {
		t.Fatalf("step %v after the cap, want 40ms", b.Step)
	}
}
