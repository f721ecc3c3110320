package idemamqp_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore/handdedup"
)

// benchBroker is the broker process whose CPU the benchmarks read: the
// process id in IDEM_BENCH_BROKER_PID (make bench-consumers' pinned run
// starts a server of its own beside the machine's), or the process named
// name.
func benchBroker(name string) string {
	if pid := os.Getenv("IDEM_BENCH_BROKER_PID"); pid != "" {
		return pid
	}
	return name
}

// BenchmarkConsume: b.N messages (distinct MessageIds, published before
// the timer starts) consumed through the wrapper or by a bare manual-ack
// loop, at concurrency 1 and 16 (the prefetch count too); msgs/s is the
// figure.
func BenchmarkConsume(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run("bare/c"+strconv.Itoa(conc), func(b *testing.B) {
			consumeBench(b, conc, func(b *testing.B, conn *amqp.Connection, queue string, handled func()) {
				ch := channel(b, conn)
				if err := ch.Qos(conc, 0, false); err != nil {
					b.Fatal(err)
				}
				ds, err := ch.Consume(queue, "", false, false, false, false, nil)
				if err != nil {
					b.Fatal(err)
				}
				var wg sync.WaitGroup
				for range conc {
					wg.Go(func() {
						for d := range ds {
							handled()
							_ = d.Ack(false)
						}
					})
				}
				b.Cleanup(func() { ch.Close(); wg.Wait() })
			})
		})
		for _, sk := range stores() {
			b.Run(sk.name+"/c"+strconv.Itoa(conc), func(b *testing.B) {
				consumeBench(b, conc, func(b *testing.B, conn *amqp.Connection, queue string, handled func()) {
					c, err := idemamqp.New(engine(b, sk.new(b), idem.Config{}), &idemamqp.Config{Operation: "bench"},
						func(context.Context, amqp.Delivery) error { handled(); return nil })
					if err != nil {
						b.Fatal(err)
					}
					run(b, conn, c, queue, conc)
				})
			})
		}
	}
}

// BenchmarkConsumeBatch: the same through RunBatch (batches of 16, the
// keys of a batch claimed in one round trip, each delivery acked on its
// own), one batch at a time with 1 and 16 of its handlers at once (c1,
// c16: the deliveries in flight; prefetch 16), and two batches at once
// (c32, prefetch 32); compare with BenchmarkConsume's bare figures.
func BenchmarkConsumeBatch(b *testing.B) {
	for _, v := range []struct{ conc, batches int }{{1, 1}, {16, 1}, {16, 2}} {
		for _, sk := range stores() {
			b.Run(sk.name+"/c"+strconv.Itoa(v.conc*v.batches), func(b *testing.B) {
				consumeBench(b, v.conc, func(b *testing.B, conn *amqp.Connection, queue string, handled func()) {
					c, err := idemamqp.New(engine(b, sk.new(b), idem.Config{}), &idemamqp.Config{Operation: "bench"},
						func(context.Context, amqp.Delivery) error { handled(); return nil })
					if err != nil {
						b.Fatal(err)
					}
					runBatch(b, conn, c, idemamqp.BatchArgs{ConsumeArgs: idemamqp.ConsumeArgs{Queue: queue, Concurrency: v.conc}, Size: 16, Batches: v.batches})
				})
			})
		}
	}
}

// BenchmarkConsumeHandDedup: the dedup a team writes by hand instead of
// idemamqp (handdedup), on the same Redis: per prefetch window (prefetch c,
// c = 16 and 32; a window is the deliveries that arrive within 2ms of its
// first, up to c, as RunBatch's batches), one pipeline of SET NX per
// delivery (its MessageId), the handlers of the deliveries it claimed, one
// pipeline of SET per outcome, then one ack of the whole window (multiple).
// It has none of idem's guarantees; compare its msgs/s and CPU per message
// with BenchmarkConsumeBatch's redis rows at the same c (deliveries in
// flight).
func BenchmarkConsumeHandDedup(b *testing.B) {
	for _, window := range []int{16, 32} {
		b.Run("redis/c"+strconv.Itoa(window), func(b *testing.B) {
			rc := redis.NewClient(&redis.Options{Addr: testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")})
			b.Cleanup(func() { rc.Close() })
			d, err := handdedup.New(rc, fmt.Sprintf("idemamqp-hand-%d:", time.Now().UnixNano()), time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			var windows atomic.Int64
			defer func() { b.ReportMetric(float64(b.N)/float64(windows.Load()), "msgs/batch") }()
			consumeBench(b, window, func(b *testing.B, conn *amqp.Connection, queue string, handled func()) {
				ch := channel(b, conn)
				if err := ch.Qos(window, 0, false); err != nil {
					b.Fatal(err)
				}
				ds, err := ch.Consume(queue, "", false, false, false, false, nil)
				if err != nil {
					b.Fatal(err)
				}
				handle := func(amqp.Delivery) ([]byte, error) { handled(); return []byte("{}"), nil }
				ctx := context.Background()
				var wg sync.WaitGroup
				wg.Go(func() {
					for {
						w := handWindow(ds, window, 2*time.Millisecond)
						if len(w) == 0 {
							return // the channel closed
						}
						windows.Add(1)
						keys := make([]string, len(w))
						for i, dl := range w {
							keys[i] = dl.MessageId
						}
						st, err := d.Batch(ctx, keys, func(i int) ([]byte, error) { return handle(w[i]) })
						if err != nil {
							b.Error(err)
							return
						}
						for i, s := range st {
							if s != handdedup.Ran {
								b.Errorf("delivery %s: %v; every message of the benchmark is new and succeeds", keys[i], s)
								return
							}
						}
						_ = w[len(w)-1].Ack(true)
					}
				})
				b.Cleanup(func() { ch.Close(); wg.Wait() })
			})
		})
	}
}

// handWindow is a hand-written consumer's next window: it waits for a
// first delivery, then takes what arrives within wait of it, up to size.
// It returns nothing once ds is closed.
func handWindow(ds <-chan amqp.Delivery, size int, wait time.Duration) []amqp.Delivery {
	d, ok := <-ds
	if !ok {
		return nil
	}
	w := append(make([]amqp.Delivery, 0, size), d)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for len(w) < size {
		select {
		case d, ok := <-ds:
			if !ok {
				return w
			}
			w = append(w, d)
		case <-timer.C:
			return w
		}
	}
	return w
}

func consumeBench(b *testing.B, conc int, start func(b *testing.B, conn *amqp.Connection, queue string, handled func())) {
	conn := dial(b)
	work, _ := queues(b, conn)
	pub := channel(b, conn)
	if err := pub.Confirm(false); err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		publish(b, pub, work, "m-"+strconv.Itoa(i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
	}
	// Wait until the broker holds them all (confirms).
	for depth(b, pub, work) < b.N {
		time.Sleep(5 * time.Millisecond)
	}
	var n atomic.Int64
	all := make(chan struct{})
	b.ResetTimer()
	cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), benchBroker("beam.smp"))
	t0 := time.Now()
	start(b, conn, work, func() {
		if n.Add(1) == int64(b.N) {
			close(all)
		}
	})
	<-all
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "msgs/s")
	cpu.Report(b, b.N)
}
