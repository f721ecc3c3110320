package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stream creates a stream of its own for t (deleted at cleanup) and
// returns the JetStream context and its subject.
func stream(t testing.TB) (jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	addr := testenv.Reach(t, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("IDEMNATS_%d", rand.Uint64())
	ctx := context.Background()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return js, s, name + ".orders"
}

func newEngine(t testing.TB, st store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.New(st, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type backend struct {
	name  string
	store func(t testing.TB) store.Store
}

func backends() []backend {
	return []backend{
		{"memstore", func(t testing.TB) store.Store {
			s := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(t testing.TB) store.Store {
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			c := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { c.Close() })
			s, err := redisstore.New(c, &redisstore.Config{Prefix: fmt.Sprintf("idemnats-test-%d:", rand.Uint64())})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
}

// orderKey keys a message by the logical order id, a header the producer
// sets on every publish of the same order.
func orderKey(m jetstream.Msg) (string, error) {
	if id := m.Headers().Get("Order-Id"); id != "" {
		return id, nil
	}
	return "", errors.New("no Order-Id")
}

func publish(t testing.TB, js jetstream.JetStream, subj, order string, pub int) {
	t.Helper()
	m := nats.NewMsg(subj)
	m.Header.Set("Order-Id", order)
	// A distinct Nats-Msg-Id per publish, so the server's own duplicate
	// detection lets the producer's duplicates through to the consumers.
	m.Header.Set(nats.MsgIdHdr, order+"/"+strconv.Itoa(pub))
	m.Data = []byte(`{"order":"` + order + `"}`)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// TestExactlyOnceAcrossConsumers: three workers on one durable consumer, 1,000
// orders of which 30% are published two or more times; every order's
// effect happens exactly once and every delivery is settled. On each path:
// alone (Consume, Wrap), or in batches of 16 (ConsumeBatch, WrapBatch,
// Concurrency 4), where a producer's copies meet in one batch, in two
// batches of one worker, or in two workers at once.
func TestExactlyOnceAcrossConsumers(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		for _, b := range backends() {
			t.Run(pa.name+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				js, s, subj := stream(t)
				st := b.store(t)
				ctx := context.Background()
				const orders = 1000
				var published int
				for i := range orders {
					id := fmt.Sprintf("order-%d", i)
					n := 1
					if i%10 < 3 {
						n = 2 + rand.IntN(2)
					}
					for p := range n {
						publish(t, js, subj, id, p)
						published++
					}
				}
				cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 1000})
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				effects := make(map[string]int)
				var settled atomic.Int64
				for w := range 3 {
					e := newEngine(t, st, idem.Config{Owner: "worker-" + strconv.Itoa(w), Lease: 10 * time.Second})
					p := pa.wrap(t, e, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 5 * time.Second, Concurrency: 4},
						func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
							if rand.IntN(10) == 0 {
								time.Sleep(time.Millisecond)
							}
							mu.Lock()
							effects[m.Headers().Get("Order-Id")]++
							mu.Unlock()
							return struct{}{}, nil
						})
					pa.consume(t, cons, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
						ds, errs := p(ctx, msgs)
						for _, d := range ds {
							if d == idemnats.Acked {
								settled.Add(1)
							}
						}
						return ds, errs
					})
				}
				deadline := time.Now().Add(60 * time.Second)
				for settled.Load() < int64(published) {
					if time.Now().After(deadline) {
						t.Fatalf("only %d of %d deliveries acked", settled.Load(), published)
					}
					time.Sleep(20 * time.Millisecond)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(effects) != orders {
					t.Fatalf("%d orders had an effect, want %d", len(effects), orders)
				}
				for id, n := range effects {
					if n != 1 {
						t.Errorf("order %s took effect %d times", id, n)
					}
				}
				t.Logf("%d publishes of %d orders, each effect once", published, orders)
			})
		}
	}
}

// recording counts how a message was settled.
type recording struct {
	jetstream.Msg
	acks, terms, naks, progress atomic.Int32
}

func (r *recording) Ack() error                         { r.acks.Add(1); return r.Msg.Ack() }
func (r *recording) Term() error                        { r.terms.Add(1); return r.Msg.Term() }
func (r *recording) TermWithReason(s string) error      { r.terms.Add(1); return r.Msg.TermWithReason(s) }
func (r *recording) Nak() error                         { r.naks.Add(1); return r.Msg.Nak() }
func (r *recording) NakWithDelay(d time.Duration) error { r.naks.Add(1); return r.Msg.NakWithDelay(d) }
func (r *recording) InProgress() error                  { r.progress.Add(1); return r.Msg.InProgress() }

func fetchOne(t testing.TB, c jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	b, err := c.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		return m
	}
	t.Fatalf("no message within %v (%v)", wait, b.Error())
	return nil
}

// TestZombieDoesNotAck: a worker whose AckWait ran out, whose message was
// redelivered to another worker and completed there, finishes late; its
// Complete is refused and it must not ack. On the batch path, in a batch
// of two, the other message of the zombie's batch is acked by its own
// verdict, as soon as its own outcome is recorded: while the zombie still
// stalls.
func TestZombieDoesNotAck(t *testing.T) {
	t.Parallel()
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			t.Parallel()
			js, s, subj := stream(t)
			ctx := context.Background()
			orders := []string{"order-z"}
			if pa.batch {
				orders = append(orders, "order-ok")
			}
			for _, o := range orders {
				publish(t, js, subj, o, 0)
			}
			const ackWait = 500 * time.Millisecond
			cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "z", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
			if err != nil {
				t.Fatal(err)
			}
			st := memstore.New(&memstore.Config{SweepInterval: -1})
			defer st.Close()
			var mu sync.Mutex
			effects := map[string]int{}
			release := make(chan struct{})
			started := make(chan struct{})
			fn := func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
				mu.Lock()
				effects[m.Headers().Get("Order-Id")]++
				mu.Unlock()
				if m.Headers().Get("Zombie") == "" {
					return struct{}{}, nil
				}
				close(started)
				<-release // stalls past AckWait and past its lease
				return struct{}{}, nil
			}
			mk := func(owner string) idemnats.ProcessBatch {
				return pa.wrap(t, newEngine(t, st, idem.Config{Owner: owner, Lease: time.Second}),
					&idemnats.Config{Operation: "ship", Key: orderKey, AckWait: ackWait}, fn)
			}
			zombie, healthy := mk("zombie"), mk("healthy")

			var first []jetstream.Msg
			for len(first) < len(orders) {
				for _, m := range fetchN(t, cons, len(orders)-len(first), time.Second) {
					if m.Headers().Get("Order-Id") == "order-z" {
						m.Headers().Set("Zombie", "1")
					}
					first = append(first, &recording{Msg: m})
				}
			}
			type answer struct {
				ds   []idemnats.Disposition
				errs []error
			}
			done := make(chan answer, 1)
			// A deadline marked EndsAtDeadline gives the claims a lease of
			// that length and no renewal: the zombie loses its key when the
			// deadline passes, as a paused process would.
			zctx, cancel := context.WithTimeout(idem.EndsAtDeadline(ctx), 300*time.Millisecond)
			defer cancel()
			go func() {
				ds, errs := zombie(zctx, first)
				done <- answer{ds, errs}
			}()
			<-started
			// JetStream redelivers order-z after AckWait; the healthy worker
			// takes the lapsed claim over and completes it. order-ok was
			// acked by its own verdict meanwhile, while the zombie stalls:
			// it does not come back.
			deadline := time.Now().Add(10 * time.Second)
			for acked := false; !acked; {
				if time.Now().After(deadline) {
					t.Fatal("order-z never acked by the healthy worker")
				}
				msgs := fetchN(t, cons, 1, 5*time.Second)
				ds, errs := healthy(ctx, msgs)
				for i, m := range msgs {
					if m.Headers().Get("Order-Id") != "order-z" {
						continue
					}
					if md, _ := m.Metadata(); md.NumDelivered < 2 {
						t.Fatalf("delivery %d, want a redelivery", md.NumDelivered)
					}
					if ds[i] != idemnats.Acked {
						t.Fatalf("healthy worker: %v, %v; want acked", ds[i], errs[i])
					}
					acked = true
				}
			}
			for _, m := range first {
				if r := m.(*recording); r.Headers().Get("Order-Id") == "order-ok" && r.acks.Load() != 1 {
					t.Fatalf("order-ok acked %d times while the zombie stalls, want once", r.acks.Load())
				}
			}
			close(release)
			a := <-done
			for i, m := range first {
				r := m.(*recording)
				n := r.acks.Load() + r.terms.Load() + r.naks.Load()
				if r.Headers().Get("Order-Id") == "order-z" {
					if a.ds[i] != idemnats.Left || !errors.Is(a.errs[i], idem.ErrLeaseLost) {
						t.Fatalf("zombie: %v, %v; want left with ErrLeaseLost", a.ds[i], a.errs[i])
					}
					if n != 0 {
						t.Fatalf("zombie settled its delivery %d times", n)
					}
					continue
				}
				if a.ds[i] != idemnats.Acked || r.acks.Load() != 1 || n != 1 {
					t.Fatalf("the zombie's other message: %v, %v (acks %d, settled %d); want acked once", a.ds[i], a.errs[i], r.acks.Load(), n)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			want := map[string]int{"order-z": 2} // the zombie's, which the store could not record, and the takeover's
			if pa.batch {
				want["order-ok"] = 1
			}
			if fmt.Sprint(effects) != fmt.Sprint(want) {
				t.Fatalf("effects %v; want %v", effects, want)
			}
		})
	}
}

// TestTerminalIsTermed: a terminal error is stored and the message
// terminated; a redelivery of the same order replays it and terms again
// without running the handler.
func TestTerminalIsTermed(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	publish(t, js, subj, "order-t", 0)
	publish(t, js, subj, "order-t", 1)
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	var runs atomic.Int32
	p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Lease: 2 * time.Second}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: time.Second},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			runs.Add(1)
			return struct{}{}, idem.Terminal(errors.New("card declined"), "declined")
		})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		m := &recording{Msg: fetchOne(t, cons, time.Second)}
		d, err := p(ctx, m)
		if d != idemnats.Termed || !errors.Is(err, idem.ErrTerminal) || m.terms.Load() != 1 || m.acks.Load() != 0 {
			t.Fatalf("delivery %d: %v, %v (terms %d acks %d); want termed", i, d, err, m.terms.Load(), m.acks.Load())
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	// Nothing comes back.
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		md, _ := m.Metadata()
		t.Fatalf("redelivered after Term: delivery %d", md.NumDelivered)
	}
}

// TestRetryableNaksAndHeartbeat: a long handler sends InProgress; a
// retryable error naks and the next delivery runs again.
func TestRetryableNaksAndHeartbeat(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	publish(t, js, subj, "order-r", 0)
	const ackWait = 300 * time.Millisecond
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "r", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	var runs atomic.Int32
	p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Lease: time.Second}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: ackWait},
		func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
			if runs.Add(1) == 1 {
				return struct{}{}, errors.New("downstream busy")
			}
			time.Sleep(4 * ackWait) // long: held by heartbeats, not redelivered
			return struct{}{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	m1 := &recording{Msg: fetchOne(t, cons, time.Second)}
	if d, _ := p(ctx, m1); d != idemnats.Nakked || m1.naks.Load() != 1 {
		t.Fatalf("first delivery: %v, want nakked", d)
	}
	m2 := &recording{Msg: fetchOne(t, cons, time.Second)}
	if d, err := p(ctx, m2); d != idemnats.Acked {
		t.Fatalf("second delivery: %v, %v; want acked", d, err)
	}
	if m2.progress.Load() < 3 {
		t.Fatalf("%d InProgress heartbeats, want at least 3", m2.progress.Load())
	}
	b, _ := cons.Fetch(1, jetstream.FetchMaxWait(2*ackWait))
	for m := range b.Messages() {
		md, _ := m.Metadata()
		t.Fatalf("redelivered during a heartbeat-held run: delivery %d", md.NumDelivered)
	}
}

func TestConfigChecked(t *testing.T) {
	t.Parallel()
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	e := newEngine(t, st, idem.Config{Lease: 10 * time.Second, RenewInterval: 5 * time.Second})
	fn := func(context.Context, jetstream.Msg) (struct{}, error) { return struct{}{}, nil }
	for name, c := range map[string]idemnats.Config{
		"no operation":            {AckWait: time.Second},
		"no AckWait":              {Operation: "x"},
		"AckWait over lease":      {Operation: "x", AckWait: 30 * time.Second},
		"heartbeat over AckWait":  {Operation: "x", AckWait: 2 * time.Second, Heartbeat: 3 * time.Second},
		"heartbeat equal AckWait": {Operation: "x", AckWait: 2 * time.Second, Heartbeat: 2 * time.Second},
	} {
		if _, err := idemnats.Wrap(e, &c, fn); !errors.Is(err, idemnats.ErrInvalidConfig) || !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemnats.Wrap(e, &idemnats.Config{Operation: "x", AckWait: 3 * time.Second}, fn); err != nil {
		t.Errorf("default heartbeat under AckWait: %v", err)
	}
}

// TestUnstorableResultIsTermed: a success whose result is over the
// engine's limit is stored as a terminal marker; the message is termed,
// not left to come back.
func TestUnstorableResultIsTermed(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	publish(t, js, subj, "order-big", 0)
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "big", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Lease: 2 * time.Second, MaxResultBytes: 16}), &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: time.Second},
		func(ctx context.Context, m jetstream.Msg) (string, error) { return strings.Repeat("x", 100), nil })
	if err != nil {
		t.Fatal(err)
	}
	m := &recording{Msg: fetchOne(t, cons, time.Second)}
	if d, err := p(ctx, m); d != idemnats.Termed || !errors.Is(err, idem.ErrResultTooLarge) || m.terms.Load() != 1 {
		t.Fatalf("%v, %v; want termed with ErrResultTooLarge", d, err)
	}
}
