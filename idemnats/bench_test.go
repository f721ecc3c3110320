package idemnats_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
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

// BenchmarkRedisBaseline: what the store does per message, written by
// hand — a SET NX of the claim and a SET of the outcome, pipelined, 16
// messages in flight — for the Redis CPU per message the consumer rows are
// compared with (redis-cpu-µs/msg, in the same run).
func BenchmarkRedisBaseline(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: benchkit.StoreRedis()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Missing(b, "no Redis at "+benchkit.StoreRedis()+": "+err.Error())
	}
	prefix := fmt.Sprintf("idemnats-baseline-%d:", time.Now().UnixNano())
	value := strings.Repeat("v", 64)
	var next atomic.Int64
	b.ResetTimer()
	cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), "")
	start := time.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				k := prefix + strconv.FormatInt(i, 10)
				p := c.Pipeline()
				p.SetNX(ctx, k, value, time.Hour)
				p.Set(ctx, k, value+"done", time.Hour)
				if _, err := p.Exec(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	cpu.Report(b, b.N)
	for i := range b.N {
		c.Del(ctx, prefix+strconv.Itoa(i))
	}
}

// BenchmarkConsume: messages/s through the wrapper against the bare
// handler (which only acks), each message a distinct key, with 1 and 16
// handlers at once on one durable consumer of a server on this machine.
func BenchmarkConsume(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("bare/c=%d", conc), func(b *testing.B) {
			consume(b, conc, func(ctx context.Context, m jetstream.Msg) bool { return m.Ack() == nil })
		})
		for _, be := range backends() {
			b.Run(fmt.Sprintf("%s/c=%d", be.name, conc), func(b *testing.B) {
				e := newEngine(b, be.store(b), idem.Config{Lease: 30 * time.Second})
				p, err := idemnats.Wrap(e, &idemnats.Config{Operation: "bench", AckWait: 30 * time.Second},
					func(context.Context, jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
				if err != nil {
					b.Fatal(err)
				}
				consume(b, conc, func(ctx context.Context, m jetstream.Msg) bool {
					d, _ := p(ctx, m)
					return d == idemnats.Acked
				})
			})
		}
	}
}

// BenchmarkConsumeBatch: the same through the batch path (ConsumeBatch
// with WrapBatch, batches of 16, the keys of a batch claimed in one
// round trip), one batch running at a time with 1 and 16 of its handlers
// at once (c=1, c=16: the messages in flight), and two batches of 16 at
// once (c=32); compare with BenchmarkConsume's bare and per-message
// figures.
func BenchmarkConsumeBatch(b *testing.B) {
	// bare: ConsumeBatch's pulls with a ProcessBatch that only acks, the
	// batch path's own floor.
	b.Run("bare/c=16", func(b *testing.B) {
		consumeBatch(b, 1, func(_ context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
			ds := make([]idemnats.Disposition, len(msgs))
			for i, m := range msgs {
				if m.Ack() == nil {
					ds[i] = idemnats.Acked
				}
			}
			return ds, make([]error, len(msgs))
		})
	})
	for _, v := range []struct{ conc, batches int }{{1, 1}, {16, 1}, {16, 2}} {
		conc := v.conc
		for _, be := range backends() {
			b.Run(fmt.Sprintf("%s/c=%d", be.name, v.conc*v.batches), func(b *testing.B) {
				e := newEngine(b, be.store(b), idem.Config{Lease: 30 * time.Second})
				p, err := idemnats.WrapBatch(e, &idemnats.Config{Operation: "bench", AckWait: 30 * time.Second, Concurrency: conc},
					func(context.Context, jetstream.Msg) (struct{}, error) { return struct{}{}, nil })
				if err != nil {
					b.Fatal(err)
				}
				consumeBatch(b, v.batches, p)
			})
		}
	}
}

// BenchmarkConsumeHandDedup: the dedup a team writes by hand instead of
// idemnats (handdedup), on the same Redis: per pull batch (a Fetch of c
// messages, one batch at a time), one pipeline of SET NX per message (its
// Nats-Msg-Id), the handlers of the messages it claimed, one pipeline of
// SET per outcome, then an ack per message. It has none of idem's
// guarantees; compare its msgs/s and CPU per message with
// BenchmarkConsumeBatch's redis rows at the same c (messages in flight).
func BenchmarkConsumeHandDedup(b *testing.B) {
	for _, size := range []int{16, 32} {
		b.Run(fmt.Sprintf("redis/c=%d", size), func(b *testing.B) {
			rc := redis.NewClient(&redis.Options{Addr: testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")})
			defer rc.Close()
			d, err := handdedup.New(rc, fmt.Sprintf("idemnats-hand-%d:", time.Now().UnixNano()), time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			cons, n := prepare(b)
			ctx := context.Background()
			handle := func(jetstream.Msg) ([]byte, error) { return []byte("{}"), nil }
			done, batches := 0, 0
			b.ResetTimer()
			cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), benchBroker("nats-server"))
			start := time.Now()
			for done < n {
				// At most what is left, so that the last pull does not
				// wait out FetchMaxWait for messages that never come.
				mb, err := cons.Fetch(min(size, n-done), jetstream.FetchMaxWait(10*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				var msgs []jetstream.Msg
				for m := range mb.Messages() {
					msgs = append(msgs, m)
				}
				if err := mb.Error(); err != nil {
					b.Fatal(err)
				}
				keys := make([]string, len(msgs))
				for i, m := range msgs {
					keys[i] = m.Headers().Get(nats.MsgIdHdr)
				}
				st, err := d.Batch(ctx, keys, func(i int) ([]byte, error) { return handle(msgs[i]) })
				if err != nil {
					b.Fatal(err)
				}
				for i, s := range st {
					if s != handdedup.Ran {
						b.Fatalf("message %s: %v; every message of the benchmark is new and succeeds", keys[i], s)
					}
					if err := msgs[i].Ack(); err != nil {
						b.Fatal(err)
					}
				}
				done += len(st)
				batches++
			}
			b.StopTimer()
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(n)/float64(batches), "msgs/batch")
			cpu.Report(b, n)
		})
	}
}

// consumeBatch runs ConsumeBatch with p over b.N messages, batches of 16,
// atOnce at once, and reports msgs/s, msgs/batch and the CPU per message.
func consumeBatch(b *testing.B, atOnce int, p idemnats.ProcessBatch) {
	cons, n := prepare(b)
	var done, batches atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	b.ResetTimer()
	cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), benchBroker("nats-server"))
	start := time.Now()
	go func() {
		exited <- idemnats.ConsumeBatch(ctx, cons, &idemnats.BatchConfig{Size: 16, Batches: atOnce}, func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
			batches.Add(1)
			ds, errs := p(ctx, msgs)
			for _, d := range ds {
				if d == idemnats.Acked {
					done.Add(1)
				}
			}
			return ds, errs
		})
	}()
	for done.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(n)/float64(batches.Load()), "msgs/batch")
	cpu.Report(b, n)
	cancel()
	if err := <-exited; err != nil {
		b.Fatal(err)
	}
}

// prepare publishes b.N messages with distinct keys to a stream of their
// own and returns a durable consumer of it.
func prepare(b *testing.B) (jetstream.Consumer, int) {
	js, s, subj := stream(b)
	ctx := context.Background()
	for i := range b.N {
		m := nats.NewMsg(subj)
		m.Header.Set(nats.MsgIdHdr, "m-"+strconv.Itoa(i))
		m.Data = []byte(`{"n":` + strconv.Itoa(i) + `}`)
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing timed out")
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 10000})
	if err != nil {
		b.Fatal(err)
	}
	return cons, b.N
}

func consume(b *testing.B, conc int, handle func(context.Context, jetstream.Msg) bool) {
	cons, _ := prepare(b)
	ctx := context.Background()
	var done atomic.Int64
	b.ResetTimer()
	cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), benchBroker("nats-server"))
	start := time.Now()
	for range conc {
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if handle(ctx, m) {
				done.Add(1)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
	}
	for done.Load() < int64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	cpu.Report(b, b.N)
}
