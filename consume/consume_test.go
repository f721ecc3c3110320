package consume_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Every row of the package doc's table, from the engine's answer alone.
func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Now()
	fenced := &store.FencedError{Key: "k", Fence: 1, Current: 2, CurrentOwner: "other", Status: store.StatusInProgress}
	down := fmt.Errorf("redisstore: complete k: %w", store.ErrUnavailable)
	inProg := &idem.InProgressError{Key: "k", LeaseUntil: now.Add(7 * time.Second)}
	term := idem.Terminal(errors.New("declined"), "declined")
	for _, c := range []struct {
		name string
		res  idem.Result[int]
		err  error
		want consume.Action
	}{
		{"recorded", idem.Result[int]{Fence: 1, Recorded: idem.StatusCompleted}, nil, consume.Done},
		{"replayed", idem.Result[int]{Replayed: true}, nil, consume.Done},
		{"no claim (engine disabled)", idem.Result[int]{}, nil, consume.Done},
		{"outcome write failed", idem.Result[int]{Fence: 1, Unrecorded: down}, nil, consume.Done},
		{"terminal", idem.Result[int]{Fence: 1, Recorded: idem.StatusFailed}, term, consume.DeadLetter},
		{"result too large", idem.Result[int]{Fence: 1, Recorded: idem.StatusFailed}, nil, consume.DeadLetter},
		{"mismatch", idem.Result[int]{}, fmt.Errorf("wrapped: %w", idem.ErrMismatch), consume.DeadLetter},
		{"invalid key", idem.Result[int]{}, idem.ErrInvalidKey, consume.DeadLetter},
		{"no usable key", idem.Result[int]{}, consume.NoKey(errors.New("no Nats-Msg-Id header")), consume.DeadLetter},
		{"held elsewhere", idem.Result[int]{}, inProg, consume.RetryAfter},
		{"held for an operator", idem.Result[int]{}, &idem.HeldError{Key: "k", LeaseUntil: now.Add(-time.Second)}, consume.DeadLetter},
		{"retryable", idem.Result[int]{Fence: 1}, errors.New("flaky"), consume.Retry},
		{"store failed at claim", idem.Result[int]{}, &idem.StoreError{Op: observe.StoreClaim, Err: down}, consume.Retry},
		{"uncertain", idem.Result[int]{Fence: 1}, idem.Uncertain(errors.New("reset")), consume.Leave},
		{"complete refused", idem.Result[int]{Fence: 1, Unrecorded: fenced}, nil, consume.Leave},
		{"complete found the record gone", idem.Result[int]{Fence: 1, Unrecorded: store.ErrNotFound}, nil, consume.Leave},
		{"release refused after an error", idem.Result[int]{Fence: 1, Unrecorded: fenced}, errors.New("flaky"), consume.Leave},
		{"fail refused after a terminal error", idem.Result[int]{Fence: 1, Unrecorded: fenced}, term, consume.Leave},
		{"fail failed after a terminal error", idem.Result[int]{Fence: 1, Unrecorded: down}, term, consume.DeadLetter},
	} {
		v := consume.Decide(c.res, c.err, now)
		if v.Action != c.want {
			t.Errorf("%s: %v (%v), want %v", c.name, v.Action, v.Err, c.want)
		}
		if v.Action != consume.Done && v.Err == nil {
			t.Errorf("%s: %v without a reason", c.name, v.Action)
		}
		switch c.want {
		case consume.RetryAfter:
			if v.Delay <= 6*time.Second || v.Delay > 7*time.Second {
				t.Errorf("%s: delay %v, want the holder's lease (7s)", c.name, v.Delay)
			}
		case consume.Leave:
			if c.res.Unrecorded != nil && (!errors.Is(v.Err, consume.ErrOutcomeNotRecorded) || !errors.Is(v.Err, idem.ErrLeaseLost)) {
				t.Errorf("%s: %v, want ErrOutcomeNotRecorded and ErrLeaseLost", c.name, v.Err)
			}
		}
	}
}

// The batch defaults are the figures idemnats' BatchConfig and idemamqp's
// BatchArgs document (16, 2ms, 2); a set field is kept, a negative one too
// (each consumer refuses it with its own error).
func TestBatchingDefaults(t *testing.T) {
	t.Parallel()
	if got, want := (consume.Batching{}).WithDefaults(), (consume.Batching{Size: 16, Wait: 2 * time.Millisecond, Batches: 2}); got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	set := consume.Batching{Size: 3, Wait: time.Second, Batches: 1}
	if got := set.WithDefaults(); got != set {
		t.Errorf("set fields %+v became %+v", set, got)
	}
	neg := consume.Batching{Size: -1, Wait: -time.Millisecond, Batches: -2}
	if got := neg.WithDefaults(); got != neg {
		t.Errorf("negative fields %+v became %+v", neg, got)
	}
}

// NoKey keeps the reason's text and chain and adds ErrNoKey.
func TestNoKey(t *testing.T) {
	t.Parallel()
	why := errors.New("idemnats: message has no Nats-Msg-Id header")
	err := consume.NoKey(fmt.Errorf("idemnats: no key: %w", why))
	if !errors.Is(err, consume.ErrNoKey) || !errors.Is(err, why) || err.Error() != "idemnats: no key: "+why.Error() {
		t.Errorf("NoKey: %q, ErrNoKey %v, its reason %v", err, errors.Is(err, consume.ErrNoKey), errors.Is(err, why))
	}
	v := consume.Decide(idem.Result[struct{}]{}, err, time.Time{})
	if v.Action != consume.DeadLetter || v.Err != err {
		t.Errorf("Decide(NoKey): %v %v, want dead-letter with the reason", v.Action, v.Err)
	}
	if consume.NoKey(nil) != nil {
		t.Error("NoKey(nil) is not nil")
	}
}
