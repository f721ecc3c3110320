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
// effect happens exactly once and every delivery is settled.
func TestExactlyOnceAcrossConsumers(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
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
				p, err := idemnats.Wrap(e, &idemnats.Config{Operation: "ship", Key: orderKey, AckWait: 5 * time.Second},
					func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
						if rand.IntN(10) == 0 {
							time.Sleep(time.Millisecond)
						}
						mu.Lock()
						effects[m.Headers().Get("Order-Id")]++
						mu.Unlock()
						return struct{}{}, nil
					})
				if err != nil {
					t.Fatal(err)
				}
				cc, err := cons.Consume(func(m jetstream.Msg) {
					if d, _ := p(ctx, m); d == idemnats.Acked {
						settled.Add(1)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cc.Stop)
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
// Complete is refused and it must not ack.
func TestZombieDoesNotAck(t *testing.T) {
	t.Parallel()
	js, s, subj := stream(t)
	ctx := context.Background()
	publish(t, js, subj, "order-z", 0)
	const ackWait = 500 * time.Millisecond
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "z", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	defer st.Close()
	var effects atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	fn := func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
		effects.Add(1)
		if m.Headers().Get("Zombie") == "" {
			return struct{}{}, nil
		}
		close(started)
		<-release // stalls past AckWait and past its lease
		return struct{}{}, nil
	}
	mk := func(owner string) idemnats.Process {
		p, err := idemnats.Wrap(newEngine(t, st, idem.Config{Owner: owner, Lease: time.Second}),
			&idemnats.Config{Operation: "ship", Key: orderKey, AckWait: ackWait}, fn)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	zombie, healthy := mk("zombie"), mk("healthy")

	first := &recording{Msg: fetchOne(t, cons, time.Second)}
	first.Headers().Set("Zombie", "1")
	type answer struct {
		d   idemnats.Disposition
		err error
	}
	done := make(chan answer, 1)
	// A deadline marked EndsAtDeadline gives the claim a lease of that
	// length and no renewal: the zombie loses the key when the deadline
	// passes, as a paused process would.
	zctx, cancel := context.WithTimeout(idem.EndsAtDeadline(ctx), 300*time.Millisecond)
	defer cancel()
	go func() {
		d, err := zombie(zctx, first)
		done <- answer{d, err}
	}()
	<-started
	// JetStream redelivers after AckWait; the healthy worker takes the
	// lapsed claim over and completes.
	second := &recording{Msg: fetchOne(t, cons, 5*time.Second)}
	if md, _ := second.Metadata(); md.NumDelivered < 2 {
		t.Fatalf("delivery %d, want a redelivery", md.NumDelivered)
	}
	if d, err := healthy(ctx, second); d != idemnats.Acked {
		t.Fatalf("healthy worker: %v, %v; want acked", d, err)
	}
	close(release)
	a := <-done
	if a.d != idemnats.Left || !errors.Is(a.err, idem.ErrLeaseLost) {
		t.Fatalf("zombie: %v, %v; want left with ErrLeaseLost", a.d, a.err)
	}
	if n := first.acks.Load() + first.terms.Load() + first.naks.Load(); n != 0 {
		t.Fatalf("zombie settled its delivery %d times", n)
	}
	if n := effects.Load(); n != 2 {
		t.Fatalf("%d effects, want 2 (the zombie's, which the store could not record, and the takeover's)", n)
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
