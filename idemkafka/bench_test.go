package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
)

// BenchmarkConsume consumes b.N records of a topic of 4 partitions (on the
// kfake emulator in this process, or KAFKA_BROKERS), with a bare franz-go
// group consumer (poll, commit each poll) and with idemkafka over
// memstore and over the real Redis, and reports records per second
// (msgs/s) and CPU per record: this process's (client-cpu-µs/msg, the
// emulator's included when it runs here) and the store's Redis's
// (redis-cpu-µs/msg), the metrics of the other consumers' benchmarks.
func BenchmarkConsume(b *testing.B) {
	for _, name := range []string{"bare", "idemkafka", "idemkafka+redis"} {
		b.Run(name, func(b *testing.B) {
			seeds := brokers(b)
			tp := topic(b, seeds, 4)
			recs := make([]*kgo.Record, b.N)
			for i := range recs {
				recs[i] = keyed(tp, int32(i%4), fmt.Sprintf("order-%d", i))
			}
			for i := 0; i < len(recs); i += 1000 {
				produce(b, seeds, recs[i:min(i+1000, len(recs))]...)
			}
			group := "g-" + tp
			var n atomic.Int64
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			b.ResetTimer()
			cpu := benchkit.StartCPU(b, benchkit.StoreRedis(), "")
			start := time.Now()
			switch name {
			case "bare":
				cl, err := kgo.NewClient(groupOpts(seeds, group, tp)...)
				if err != nil {
					b.Fatal(err)
				}
				defer cl.Close()
				for n.Load() < int64(b.N) {
					fs := cl.PollRecords(ctx, 100)
					fs.EachRecord(func(*kgo.Record) { n.Add(1) })
					if err := cl.CommitUncommittedOffsets(ctx); err != nil {
						b.Fatal(err)
					}
				}
			default:
				e := memEngine(b)
				if name == "idemkafka+redis" {
					e = newEngine(b, redisStore(b, fmt.Sprintf("idemkafka-bench-%d:", rand.Uint64())), idem.Config{Lease: 30 * time.Second})
				}
				c, err := idemkafka.New(e, &idemkafka.Config{Operation: "ship",
					Settled: func(_ *kgo.Record, v consume.Verdict) {
						if v.Action == consume.Done && n.Add(1) == int64(b.N) {
							stop()
						}
					},
				}, func(context.Context, *kgo.Record) (struct{}, error) { return struct{}{}, nil }, groupOpts(seeds, group, tp)...)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				if err := c.Run(ctx); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			cpu.Report(b, b.N)
		})
	}
}
