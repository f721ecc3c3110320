package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A consumer that ships each order once, however often it is published.
// The producer puts the order id in an Order-Id header on every publish;
// the key comes from there, not from Nats-Msg-Id. (It needs a NATS server
// with JetStream, at IDEM_NATS_URL or 127.0.0.1:4222; TestExampleHandler
// runs it and checks its output.)
func ExampleHandler() {
	ctx := context.Background()
	url := os.Getenv("IDEM_NATS_URL")
	if url == "" {
		url = "127.0.0.1:4222"
	}
	nc, err := nats.Connect("nats://" + url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EXAMPLE_ORDERS", Subjects: []string{"example.orders"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer js.DeleteStream(ctx, "EXAMPLE_ORDERS")

	// The producer publishes order 42 twice (a retry after a timeout).
	for range 2 {
		m := nats.NewMsg("example.orders")
		m.Header.Set("Order-Id", "42")
		m.Data = []byte(`{"order":42,"item":"book"}`)
		js.PublishMsg(ctx, m)
	}

	st := memstore.New(nil) // in production: redisstore, pgstore, ...
	defer st.Close()
	engine, _ := idem.New(st, &idem.Config{Lease: time.Minute})

	const ackWait = 30 * time.Second
	cons, _ := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "shipper", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	var wg sync.WaitGroup
	wg.Add(2) // deliveries
	process, err := idemnats.Wrap(engine, &idemnats.Config{
		Operation: "orders.ship",
		AckWait:   ackWait, // at most the engine's Lease
		Key: func(m jetstream.Msg) (string, error) {
			if id := m.Headers().Get("Order-Id"); id != "" {
				return id, nil
			}
			return "", errors.New("no Order-Id header")
		},
	}, func(ctx context.Context, m jetstream.Msg) (string, error) {
		fmt.Println("shipping order", m.Headers().Get("Order-Id"))
		return "tracking-1", nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	cc, _ := cons.Consume(func(m jetstream.Msg) {
		defer wg.Done()
		d, _ := process(ctx, m)
		fmt.Println(d)
	})
	wg.Wait()
	cc.Stop()
	// Output is not checked here, because it needs a server; see
	// TestExampleHandler. It prints:
	//
	// shipping order 42
	// acked
	// acked
}

func TestExampleHandler(t *testing.T) {
	testenv.Reach(t, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	ExampleHandler()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if got, want := strings.TrimSpace(string(out)), "shipping order 42\nacked\nacked"; got != want {
		t.Fatalf("example printed\n%s\nwant\n%s", got, want)
	}
}

// The same consumer taking messages in batches: the keys of a batch are
// claimed together, and each message is settled by its own outcome. The
// engine waits for a copy in flight (Wait), so the producer's retry,
// fetched beside the original, is acked as a replay. (TestExampleConsumeBatch
// runs it against a server and checks its output.)
func ExampleConsumeBatch() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := os.Getenv("IDEM_NATS_URL")
	if url == "" {
		url = "127.0.0.1:4222"
	}
	nc, err := nats.Connect("nats://" + url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EXAMPLE_BATCH", Subjects: []string{"example.batch"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer js.DeleteStream(context.Background(), "EXAMPLE_BATCH")
	for _, order := range []string{"42", "42", "43"} {
		m := nats.NewMsg("example.batch")
		m.Header.Set("Order-Id", order)
		m.Data = []byte(`{"order":` + order + `}`)
		js.PublishMsg(ctx, m)
	}

	st := memstore.New(nil)
	defer st.Close()
	engine, _ := idem.New(st, &idem.Config{Lease: time.Minute, Wait: 10 * time.Second})
	const ackWait = 30 * time.Second
	cons, _ := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "shipper", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	process, err := idemnats.WrapBatch(engine, &idemnats.Config{
		Operation:   "orders.ship",
		AckWait:     ackWait,
		Concurrency: 1, // one handler of a batch at a time
		Key: func(m jetstream.Msg) (string, error) {
			if id := m.Headers().Get("Order-Id"); id != "" {
				return id, nil
			}
			return "", errors.New("no Order-Id header")
		},
	}, func(ctx context.Context, m jetstream.Msg) (string, error) {
		fmt.Println("shipping order", m.Headers().Get("Order-Id"))
		return "tracking-1", nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	acked := 0
	err = idemnats.ConsumeBatch(ctx, cons, &idemnats.BatchConfig{Size: 16, Batches: 1}, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
		ds, errs := process(ctx, msgs)
		for _, d := range ds {
			if d == idemnats.Acked {
				acked++
			}
		}
		if acked == 3 {
			cancel() // ConsumeBatch returns once this batch is done
		}
		return ds, errs
	})
	fmt.Println(acked, "acked", err)
	// It prints:
	//
	// shipping order 42
	// shipping order 43
	// 3 acked <nil>
}

func TestExampleConsumeBatch(t *testing.T) {
	testenv.Reach(t, "NATS", "IDEM_NATS_URL", "127.0.0.1:4222")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	ExampleConsumeBatch()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if got, want := strings.TrimSpace(string(out)), "shipping order 42\nshipping order 43\n3 acked <nil>"; got != want {
		t.Fatalf("example printed\n%s\nwant\n%s", got, want)
	}
}
