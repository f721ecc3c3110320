package idemlambda_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func batch(n int, arn string) events.SQSEvent {
	var ev events.SQSEvent
	for i := range n {
		ev.Records = append(ev.Records, events.SQSMessage{
			MessageId: fmt.Sprintf("m-%02d", i), Body: fmt.Sprintf(`{"order_id":"o-%d"}`, i),
			EventSource: "aws:sqs", EventSourceARN: arn,
		})
	}
	return ev
}

func failed(r events.SQSEventResponse) []string {
	var ids []string
	for _, f := range r.BatchItemFailures {
		ids = append(ids, f.ItemIdentifier)
	}
	slices.Sort(ids)
	return ids
}

// TestSQSBatchRedeliveredAfterATimeout: a batch of 50 whose invocation
// completes 20 records and then hangs until its deadline. Redelivered while
// it hangs, the 20 replay and the 30 are reported as in progress; after the
// deadline, a redelivery runs each of the 30 once and still replays the 20.
func TestSQSBatchRedeliveredAfterATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		eng, err := idem.New(mem, &idem.Config{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		runs := map[string]int{}
		var mu sync.Mutex
		var completed atomic.Int64
		h, err := idemlambda.SQS(eng, "orders", func(ctx context.Context, m events.SQSMessage) error {
			mu.Lock()
			runs[m.MessageId]++
			first := runs[m.MessageId] == 1
			mu.Unlock()
			if first && completed.Add(1) > 20 {
				<-ctx.Done() // the 21st record onwards hangs until the timeout
				return ctx.Err()
			}
			return nil
		}, &idemlambda.SQSConfig{Concurrency: 50, Config: idemlambda.Config{Logger: quiet}})
		if err != nil {
			t.Fatal(err)
		}
		ev := batch(50, "arn:aws:sqs:eu-west-1:123456789012:orders")
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		firstDone := make(chan events.SQSEventResponse)
		go func() { r, _ := h(ctx, ev); firstDone <- r }()
		synctest.Wait() // 20 completed, 30 hanging

		// Redelivered while the first invocation still runs.
		r, err := h(context.Background(), ev)
		if err != nil || len(r.BatchItemFailures) != 30 {
			t.Fatalf("redelivery during the first: %d failures, %v", len(r.BatchItemFailures), err)
		}
		for id, n := range runs {
			if n != 1 {
				t.Fatalf("%s ran %d times", id, n)
			}
		}
		// The first invocation times out: its 30 records fail.
		if r := <-firstDone; len(r.BatchItemFailures) != 30 {
			t.Fatalf("first invocation: %d failures", len(r.BatchItemFailures))
		}
		// Redelivered after the timeout: the 30 run once more, the 20 replay.
		r, err = h(context.Background(), ev)
		if err != nil || len(r.BatchItemFailures) != 0 {
			t.Fatalf("redelivery after the timeout: %v %v", failed(r), err)
		}
		again := 0
		for _, n := range runs {
			if n == 2 {
				again++
			} else if n != 1 {
				t.Fatalf("a record ran %d times", n)
			}
		}
		if again != 30 || len(runs) != 50 {
			t.Fatalf("%d records ran twice, want the 30 that timed out", again)
		}
	})
}

// TestSQSClaimsGoOutTogether: every claim of a batch of 10 is made before
// any of them is answered, so the batch waits for about one claim round
// trip, not ten.
func TestSQSClaimsGoOutTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		st := &barrierStore{Store: mem, want: 10, all: make(chan struct{})}
		eng, err := idem.New(st, &idem.Config{Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		h, err := idemlambda.SQS(eng, "orders", func(context.Context, events.SQSMessage) error { return nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := h(context.Background(), batch(10, "arn:aws:sqs:eu-west-1:123456789012:orders"))
		if err != nil || len(r.BatchItemFailures) != 0 || st.timedOut.Load() {
			t.Fatalf("failures %v, %v; claims waited for each other: %v", failed(r), err, st.timedOut.Load())
		}
	})
}

// barrierStore holds every Claim until want claims are pending (or a
// minute of fake time passed, which means they were not concurrent).
type barrierStore struct {
	*memstore.Store
	want     int64
	pending  atomic.Int64
	all      chan struct{}
	once     sync.Once
	timedOut atomic.Bool
}

func (s *barrierStore) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if s.pending.Add(1) == s.want {
		s.once.Do(func() { close(s.all) })
	}
	select {
	case <-s.all:
	case <-time.After(time.Minute):
		s.timedOut.Store(true)
	}
	return s.Store.Claim(ctx, p)
}

func TestSQSFIFOStopsAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	var ran []string
	h, err := idemlambda.SQS(engine(t, idem.Config{}), "orders", func(ctx context.Context, m events.SQSMessage) error {
		ran = append(ran, m.MessageId)
		if m.MessageId == "m-02" {
			return errors.New("downstream refused")
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := h(context.Background(), batch(6, "arn:aws:sqs:eu-west-1:123456789012:orders.fifo"))
	if err != nil || !slices.Equal(failed(r), []string{"m-02", "m-03", "m-04", "m-05"}) || !slices.Equal(ran, []string{"m-00", "m-01", "m-02"}) {
		t.Fatalf("failures %v, ran %v, %v", failed(r), ran, err)
	}
}

func TestSQSKeyFromTheBody(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h, err := idemlambda.SQS(engine(t, idem.Config{}), "orders", func(ctx context.Context, m events.SQSMessage) error {
		runs.Add(1)
		return nil
	}, &idemlambda.SQSConfig{Config: idemlambda.Config{KeyJMESPath: "powertools_json(body).order_id"}})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.SQSEvent
	load(t, "sqs.json", &ev)
	// The producer sent o-1 twice, under two message ids.
	dup := ev.Records[0]
	dup.MessageId = "another-id"
	ev.Records = append(ev.Records, dup)
	if r, err := h(context.Background(), ev); err != nil || len(r.BatchItemFailures) > 1 {
		t.Fatalf("%v %v", failed(r), err)
	}
	// Two distinct orders ran; the duplicate either replayed or, when it
	// met the first still running, was reported for redelivery.
	if runs.Load() != 2 {
		t.Fatalf("runs %d", runs.Load())
	}
}

func TestEventBridge(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	fn := func(ctx context.Context, e events.EventBridgeEvent) error { runs.Add(1); return nil }
	byID, err := idemlambda.EventBridge(engine(t, idem.Config{}), "placed", fn, nil)
	if err != nil {
		t.Fatal(err)
	}
	byOrder, err := idemlambda.EventBridge(engine(t, idem.Config{}), "placed", fn, &idemlambda.Config{KeyJMESPath: "detail.orderId"})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.EventBridgeEvent
	load(t, "eventbridge.json", &ev)
	ctx := context.Background()
	byID(ctx, ev)
	byID(ctx, ev) // redelivered: same id
	put := ev
	put.ID = "second-put-of-the-same-order"
	byID(ctx, put) // a new id: runs
	if runs.Load() != 2 {
		t.Fatalf("by id: runs %d", runs.Load())
	}
	byOrder(ctx, ev)
	byOrder(ctx, put) // same detail.orderId: replayed
	if runs.Load() != 3 {
		t.Fatalf("by detail.orderId: runs %d", runs.Load())
	}
}

// TestSQSBatchClaimsInOneRoundTrip: over a store with batch claims, a
// standard queue's batch is claimed by one store call, and a redelivery
// replays it by one more.
func TestSQSBatchClaimsInOneRoundTrip(t *testing.T) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	fs := faultstore.New(mem)
	eng, err := idem.New(fs, &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h, err := idemlambda.SQS(eng, "orders", func(context.Context, events.SQSMessage) error { runs.Add(1); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := batch(10, "arn:aws:sqs:eu-west-1:1:orders")
	for round := 1; round <= 2; round++ {
		r, err := h(context.Background(), ev)
		if err != nil || len(r.BatchItemFailures) != 0 {
			t.Fatalf("round %d: %+v %v", round, r, err)
		}
		if n := fs.Calls("claim_batch"); n != int64(round) {
			t.Errorf("round %d: %d batch claims, want %d", round, n, round)
		}
	}
	if fs.Calls("claim") != 0 || runs.Load() != 10 || fs.Calls("complete") != 10 {
		t.Errorf("%d single claims, %d runs, %d completes; want 0, 10, 10", fs.Calls("claim"), runs.Load(), fs.Calls("complete"))
	}
}
