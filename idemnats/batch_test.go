package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	verdict "github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// fetchN fetches n messages (fewer if they do not come within wait).
func fetchN(t testing.TB, c jetstream.Consumer, n int, wait time.Duration) []jetstream.Msg {
	t.Helper()
	b, err := c.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatalf("no message within %v (%v)", wait, b.Error())
	}
	return out
}

// consumeBatches runs idemnats.ConsumeBatch on c with p until the test
// ends, and then checks that it returned nil.
func consumeBatches(t *testing.T, c jetstream.Consumer, cfg *idemnats.BatchConfig, p idemnats.ProcessBatch) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- idemnats.ConsumeBatch(ctx, c, cfg, p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ConsumeBatch: %v", err)
		}
	})
}

// TestBatchKeysAlone: in one batch, a message without a key is terminated
// alone, a terminal error terms only its own message, and a key named
// twice runs its handler once; its second copy answers as a concurrent
// call in one process does (DoBatch): in progress, so nakked with a delay,
// when the engine does not wait (Wait 0), and replayed, so acked, when it
// waits.
func TestBatchKeysAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		dup  idemnats.Disposition
	}{{0, idemnats.Delayed}, {5 * time.Second, idemnats.Acked}} {
		for _, b := range backends() {
			t.Run(fmt.Sprintf("%s/wait=%v", b.name, tc.wait), func(t *testing.T) {
				t.Parallel()
				js, s, subj := stream(t)
				ctx := context.Background()
				publish(t, js, subj, "order-a", 0)
				nokey := nats.NewMsg(subj)
				nokey.Header.Set(nats.MsgIdHdr, "nokey")
				if _, err := js.PublishMsg(ctx, nokey); err != nil {
					t.Fatal(err)
				}
				publish(t, js, subj, "order-a", 1)
				publish(t, js, subj, "order-declined", 0)
				publish(t, js, subj, "order-b", 0)
				cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "k", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				runs := map[string]int{}
				p, err := idemnats.WrapBatch(newEngine(t, b.store(t), idem.Config{Lease: 10 * time.Second, Wait: tc.wait}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 5 * time.Second},
					func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
						id := m.Headers().Get("Order-Id")
						mu.Lock()
						runs[id]++
						mu.Unlock()
						if id == "order-declined" {
							return struct{}{}, idem.Terminal(errors.New("card declined"), "declined")
						}
						return struct{}{}, nil
					})
				if err != nil {
					t.Fatal(err)
				}
				var msgs []jetstream.Msg
				var recs []*recording
				for len(msgs) < 5 {
					for _, m := range fetchN(t, cons, 5-len(msgs), 5*time.Second) {
						r := &recording{Msg: m}
						msgs, recs = append(msgs, r), append(recs, r)
					}
				}
				ds, errs := p(ctx, msgs)
				want := []idemnats.Disposition{idemnats.Acked, idemnats.Termed, tc.dup, idemnats.Termed, idemnats.Acked}
				for i := range msgs {
					if ds[i] != want[i] {
						t.Errorf("message %d (%s): %v (%v), want %v", i, msgs[i].Headers().Get("Order-Id"), ds[i], errs[i], want[i])
					}
					if n := recs[i].acks.Load() + recs[i].terms.Load() + recs[i].naks.Load(); n != 1 {
						t.Errorf("message %d settled %d times", i, n)
					}
				}
				if !errors.Is(errs[1], verdict.ErrNoKey) {
					t.Errorf("the keyless message's error: %v, want consume.ErrNoKey", errs[1])
				}
				if !errors.Is(errs[3], idem.ErrTerminal) {
					t.Errorf("the declined order's error: %v, want ErrTerminal", errs[3])
				}
				mu.Lock()
				defer mu.Unlock()
				if runs["order-a"] != 1 || runs["order-b"] != 1 || runs["order-declined"] != 1 || len(runs) != 3 {
					t.Errorf("handler runs %v, want one per order", runs)
				}
			})
		}
	}
}

// failKey is a memstore whose Complete of one key always fails, as if the
// store were unreachable for it.
type failKey struct {
	*memstore.Store
	key string
}

func (s failKey) Complete(ctx context.Context, p store.CompleteParams) error {
	if p.Key == s.key {
		return fmt.Errorf("connection refused: %w", store.ErrUnavailable)
	}
	return s.Store.Complete(ctx, p)
}

// CompleteBatch fails that key's Complete alone, as Complete does: the
// engine batches the Completes of messages that finish together.
func (s failKey) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = s.Complete(ctx, p)
	}
	return errs
}

// TestBatchOneWriteFailsAlone: the outcome write of one message of a batch
// fails for all of WriteTimeout; that message is settled by its own
// verdict (acked, with verdict.ErrOutcomeNotRecorded: the handler ran),
// and the others are acked with their outcomes recorded.
func TestBatchOneWriteFailsAlone(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	for i := range 3 {
		publish(t, js, subj, "order-"+strconv.Itoa(i), 0)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := memstore.New(&memstore.Config{SweepInterval: -1})
	defer m.Close()
	req := idem.Request{Operation: "ship", Key: "order-1"}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	st := failKey{Store: m, key: id.StoreKey.String()}
	e := newEngine(t, st, idem.Config{Lease: 10 * time.Second, WriteTimeout: 200 * time.Millisecond})
	p, err := idemnats.WrapBatch(e, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 5 * time.Second},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for len(msgs) < 3 {
		msgs = append(msgs, fetchN(t, cons, 3-len(msgs), 5*time.Second)...)
	}
	ds, errs := p(ctx, msgs)
	for i, msg := range msgs {
		order := msg.Headers().Get("Order-Id")
		if ds[i] != idemnats.Acked {
			t.Errorf("%s: %v (%v), want acked", order, ds[i], errs[i])
		}
		if order == "order-1" {
			if !errors.Is(errs[i], verdict.ErrOutcomeNotRecorded) {
				t.Errorf("%s: %v, want ErrOutcomeNotRecorded", order, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("%s: %v, want no error", order, errs[i])
		}
		rreq := idem.Request{Operation: "ship", Key: order}
		rid, _ := rreq.Identity()
		if rec, err := m.Get(ctx, rid.StoreKey.String()); err != nil || rec.Status != store.StatusCompleted {
			t.Errorf("%s: record %+v, %v; want COMPLETED", order, rec, err)
		}
	}
}

// TestBatchHeartbeat: a batch whose handlers run one at a time, the first
// for longer than AckWait: every message of the batch, the one running
// and the one waiting for its turn, is kept from redelivery by InProgress.
func TestBatchHeartbeat(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	publish(t, js, subj, "order-1", 0)
	publish(t, js, subj, "order-2", 0)
	const ackWait = 300 * time.Millisecond
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "h", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	p, err := idemnats.WrapBatch(newEngine(t, st, idem.Config{Lease: time.Second}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: ackWait, Concurrency: 1},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			if m.Headers().Get("Order-Id") == "order-1" {
				time.Sleep(4 * ackWait) // long: held by heartbeats, not redelivered
			}
			return struct{}{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	var recs []*recording
	var msgs []jetstream.Msg
	for len(msgs) < 2 {
		for _, m := range fetchN(t, cons, 2-len(msgs), time.Second) {
			r := &recording{Msg: m}
			recs, msgs = append(recs, r), append(msgs, r)
		}
	}
	ds, errs := p(ctx, msgs)
	for i, r := range recs {
		if ds[i] != idemnats.Acked {
			t.Errorf("message %d: %v, %v; want acked", i, ds[i], errs[i])
		}
		if r.progress.Load() < 3 {
			t.Errorf("message %d: %d InProgress heartbeats, want at least 3", i, r.progress.Load())
		}
	}
	b, _ := cons.Fetch(1, jetstream.FetchMaxWait(2*ackWait))
	for m := range b.Messages() {
		md, _ := m.Metadata()
		t.Fatalf("redelivered during a heartbeat-held batch: delivery %d", md.NumDelivered)
	}
}

func TestBatchConfigChecked(t *testing.T) {
	t.Parallel()
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	e := newEngine(t, st, idem.Config{Lease: 10 * time.Second})
	fn := func(context.Context, jetstream.Msg) (struct{}, error) { return struct{}{}, nil }
	if _, err := idemnats.WrapBatch(e, &idemnats.Config{Operation: "x", AckWait: time.Second, Concurrency: -1}, fn); !errors.Is(err, idemnats.ErrInvalidConfig) {
		t.Errorf("negative Concurrency: %v, want ErrInvalidConfig", err)
	}
	if _, err := idemnats.WrapBatch(e, &idemnats.Config{AckWait: time.Second}, fn); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("no operation: %v, want ErrInvalidConfig", err)
	}
	p, err := idemnats.WrapBatch(e, &idemnats.Config{Operation: "x", AckWait: time.Second}, fn)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]idemnats.BatchConfig{"negative Size": {Size: -1}, "negative Wait": {Wait: -time.Second}, "negative Ahead": {Ahead: -1}} {
		if err := idemnats.ConsumeBatch(context.Background(), nil, &c, p); !errors.Is(err, idemnats.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := idemnats.ConsumeBatch(context.Background(), nil, nil, p); !errors.Is(err, idemnats.ErrInvalidConfig) {
		t.Errorf("no consumer: %v, want ErrInvalidConfig", err)
	}
}

// shipConsumer is a durable consumer of s named durable (AckWait 5s) and a
// ProcessBatch over memstore whose handler succeeds.
func shipConsumer(t *testing.T, s jetstream.Stream, durable string) (jetstream.Consumer, idemnats.ProcessBatch) {
	t.Helper()
	cons, err := s.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = st.Close() })
	p, err := idemnats.WrapBatch(newEngine(t, st, idem.Config{Lease: 10 * time.Second}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 5 * time.Second},
		func(context.Context, jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
	if err != nil {
		t.Fatal(err)
	}
	return cons, p
}

// shipOrders publishes order-0 … order-(n-1), once each, to a stream of
// its own, and returns the stream's publisher and subject and a
// shipConsumer of it named durable.
func shipOrders(t *testing.T, n int, durable string) (jetstream.JetStream, string, jetstream.Consumer, idemnats.ProcessBatch) {
	t.Helper()
	js, s, subj := stream(t)
	for i := range n {
		publish(t, js, subj, "order-"+strconv.Itoa(i), 0)
	}
	cons, p := shipConsumer(t, s, durable)
	return js, subj, cons, p
}

// countAcks is p, adding to acked the messages it acknowledged.
func countAcks(p idemnats.ProcessBatch, acked *atomic.Int64) idemnats.ProcessBatch {
	return func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
		ds, errs := p(ctx, msgs)
		for _, d := range ds {
			if d == idemnats.Acked {
				acked.Add(1)
			}
		}
		return ds, errs
	}
}

// TestConsumeBatchStops: ConsumeBatch hands out batches of at most Size,
// returns nil once its context is cancelled, and leaves no goroutine
// behind (goleak in TestMain).
func TestConsumeBatchStops(t *testing.T) {
	t.Parallel()
	const n = 50
	js, subj, cons, p := shipOrders(t, n, "s")
	ctx := context.Background()
	var acked, largest atomic.Int64
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- idemnats.ConsumeBatch(cctx, cons, &idemnats.BatchConfig{Size: 8}, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
			if int64(len(msgs)) > largest.Load() {
				largest.Store(int64(len(msgs)))
			}
			return countAcks(p, &acked)(ctx, msgs)
		})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for acked.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acked", acked.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ConsumeBatch: %v, want nil after cancel", err)
	}
	if l := largest.Load(); l > 8 || l < 2 {
		t.Errorf("largest batch %d, want 2..8", l)
	}
	// Its pull stopped with it: messages published now are the next
	// consumer's at once, not held by a pull nobody reads (until AckWait).
	for i := range 3 {
		publish(t, js, subj, "after-"+strconv.Itoa(i), 0)
	}
	if got := fetchN(t, cons, 3, 2*time.Second); len(got) != 3 {
		t.Fatalf("%d of the 3 messages published after ConsumeBatch returned could be fetched", len(got))
	}
}

// TestConsumeBatchPullBounded: the long-lived pull keeps no more messages
// delivered and not yet settled than the batches in hand (Size ×
// Batches), Ahead, the Size that a batch in forming holds and one,
// however many the stream has, also while the batches are held longer
// than the pull's idle heartbeats (1s) may be missed twice; all of them
// are then settled.
func TestConsumeBatchPullBounded(t *testing.T) {
	t.Parallel()
	const n, size, batches, ahead = 80, 4, 2, 6
	_, _, cons, p := shipOrders(t, n, "bounded")
	ctx := context.Background()
	release := make(chan struct{})
	var running, acked atomic.Int64
	consumeBatches(t, cons, &idemnats.BatchConfig{Size: size, Batches: batches, Ahead: ahead}, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
		running.Add(1)
		<-release
		return countAcks(p, &acked)(ctx, msgs)
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before consumeBatches' own cleanup, also on a failure
	const most = size*batches + ahead + size + 1
	// Poll the server for what it has delivered while both batches are
	// held (past two missed heartbeats): only the pull and the batch in
	// forming can fill, up to most.
	held := time.Now().Add(3 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	last := 0
	for running.Load() < batches || time.Now().Before(held) {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches running, %d delivered unsettled", running.Load(), last)
		}
		time.Sleep(50 * time.Millisecond)
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if last = info.NumAckPending; last > most {
			t.Fatalf("%d messages delivered and not settled while the batches are held, want at most %d", last, most)
		}
	}
	if last <= size*batches {
		t.Fatalf("%d messages delivered while the batches are held, want the pull to hold more than the %d in hand", last, size*batches)
	}
	free()
	for acked.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acked", acked.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConsumeBatchNaksWhatItHeld: when ConsumeBatch's context ends, the
// messages its pull had delivered that no batch took are nakked, so they
// can be fetched at once, well within the consumer's AckWait (5s); the
// batch in hand is still settled.
func TestConsumeBatchNaksWhatItHeld(t *testing.T) {
	t.Parallel()
	const n = 20
	_, _, cons, p := shipOrders(t, n, "held")
	ctx := context.Background()
	release, started := make(chan struct{}), make(chan struct{}, 1)
	var acked atomic.Int64
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- idemnats.ConsumeBatch(cctx, cons, &idemnats.BatchConfig{Size: 2, Batches: 1, Ahead: 8}, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
			select {
			case started <- struct{}{}:
				<-release // the first batch is held until ctx has ended
			default:
			}
			return countAcks(p, &acked)(ctx, msgs)
		})
	}()
	<-started
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending >= 8 { // the batch in hand and 6 more that the pull holds
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d delivered, want the pull to fill", info.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("ConsumeBatch: %v, want nil after cancel", err)
	}
	if acked.Load() < 2 {
		t.Fatalf("%d acked, want the batch in hand settled", acked.Load())
	}
	left := n - int(acked.Load())
	if got := fetchN(t, cons, left, 2*time.Second); len(got) != left {
		t.Fatalf("%d of the %d messages not acked could be fetched within 2s (AckWait 5s)", len(got), left)
	}
}

// ackSignal closes acked when the message is acknowledged.
type ackSignal struct {
	jetstream.Msg
	acked chan struct{}
}

func (a *ackSignal) Ack() error {
	err := a.Msg.Ack()
	close(a.acked)
	return err
}

// TestBatchSettlesEachOnItsOwnOutcome: a message is acknowledged as soon
// as its own outcome is recorded, not at the pace of its batch's slowest:
// the second message's handler runs until the first message has been
// acked, its outcome recorded in the store.
func TestBatchSettlesEachOnItsOwnOutcome(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			js, s, subj := stream(t)
			st := b.store(t)
			ctx := context.Background()
			publish(t, js, subj, "order-fast", 0)
			publish(t, js, subj, "order-slow", 0)
			cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "each", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			var msgs []jetstream.Msg
			for len(msgs) < 2 {
				msgs = append(msgs, fetchN(t, cons, 2-len(msgs), time.Second)...)
			}
			fast := &ackSignal{Msg: msgs[0], acked: make(chan struct{})}
			msgs[0] = fast
			e := newEngine(t, st, idem.Config{})
			var key string
			p, err := idemnats.WrapBatch(e, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 30 * time.Second},
				func(ctx context.Context, m jetstream.Msg) (string, error) {
					if m.Headers().Get("Order-Id") == "order-slow" {
						select {
						case <-fast.acked:
						case <-time.After(30 * time.Second):
							return "", errors.New("the first message was not acked while the second ran")
						}
						rec, err := st.Get(ctx, key)
						if err != nil || rec.Status != store.StatusCompleted {
							return "", fmt.Errorf("acked before its outcome was recorded: %+v, %v", rec, err)
						}
					} else if c, ok := idem.FromContext(ctx); ok {
						key = c.Key
					}
					return "shipped", nil
				})
			if err != nil {
				t.Fatal(err)
			}
			ds, errs := p(ctx, msgs)
			for i := range msgs {
				if ds[i] != idemnats.Acked || errs[i] != nil {
					t.Errorf("message %d: %v, %v; want acked", i, ds[i], errs[i])
				}
			}
		})
	}
}

// TestConsumeBatchConsumerDeleted: a consumer deleted under ConsumeBatch
// (while a pull waits for messages, or before the next pull) ends it with
// the pull's error, within a few seconds.
func TestConsumeBatchConsumerDeleted(t *testing.T) {
	t.Parallel()
	_, s, _ := stream(t)
	ctx := context.Background()
	cons, p := shipConsumer(t, s, "gone")
	done := make(chan error, 1)
	go func() { done <- idemnats.ConsumeBatch(ctx, cons, nil, p) }()
	if err := s.DeleteConsumer(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ConsumeBatch returned nil after its consumer was deleted")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ConsumeBatch still runs 10s after its consumer was deleted (a waiting pull's heartbeat is 1s)")
	}
}
