package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/redisstore/handdedup"
)

// benchPartitions is the number of partitions of a benchmark's topic, and
// benchPoll the records a consumer takes from one poll.
const (
	benchPartitions = 4
	benchPoll       = 100
)

// benchTopic produces b.N records with distinct keys to a topic of
// benchPartitions partitions (on the kfake emulator in this process, or
// KAFKA_BROKERS) and returns the seeds and the options of a group
// consumer of it.
func benchTopic(b *testing.B) (seeds []string, opts []kgo.Opt) {
	seeds = brokers(b)
	tp := topic(b, seeds, benchPartitions)
	recs := make([]*kgo.Record, b.N)
	for i := range recs {
		recs[i] = keyed(tp, int32(i%benchPartitions), fmt.Sprintf("order-%d", i))
	}
	for i := 0; i < len(recs); i += 1000 {
		produce(b, seeds, recs[i:min(i+1000, len(recs))]...)
	}
	return seeds, groupOpts(seeds, "g-"+tp, tp)
}

// BenchmarkConsume consumes b.N records of a topic of 4 partitions (on the
// kfake emulator in this process, or KAFKA_BROKERS), with a bare franz-go
// group consumer (poll, commit each poll) and with idemkafka over
// memstore, the real Redis, DynamoDB Local and PostgreSQL, and reports
// records per second (msgs/s) and CPU per record: this process's
// (client-cpu-µs/msg, the emulator's included when it runs here) and the
// store's Redis's (redis-cpu-µs/msg; not over DynamoDB and PostgreSQL,
// whose servers' CPU is not read), the metrics of the other consumers'
// benchmarks. idemkafka+dynamodb needs DynamoDB Local
// (IDEM_DYNAMODB_ENDPOINT, scripts/dynamodb-local run), idemkafka+postgres
// PostgreSQL (IDEM_PG_ADDR, default 127.0.0.1:5432, database test); each
// skips without its server outside CI. BenchmarkConsumeHandDedup is the same with the dedup a team
// writes by hand over the same Redis.
func BenchmarkConsume(b *testing.B) {
	stores := []struct {
		name  string
		new   func(b *testing.B) store.Store
		redis string // the Redis whose CPU is reported, "" for none
	}{
		{"idemkafka", nil, benchkit.StoreRedis()},
		{"idemkafka+redis", func(b *testing.B) store.Store {
			return redisStore(b, fmt.Sprintf("idemkafka-bench-%d:", rand.Uint64()))
		}, benchkit.StoreRedis()},
		{"idemkafka+dynamodb", dynamoBenchStore, ""},
		{"idemkafka+postgres", pgBenchStore, ""},
	}
	b.Run("bare", func(b *testing.B) {
		_, opts := benchTopic(b)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		n := 0
		measure(b, benchkit.StoreRedis(), func() {
			for n < b.N {
				fs := cl.PollRecords(ctx, benchPoll)
				fs.EachRecord(func(*kgo.Record) { n++ })
				if err := cl.CommitUncommittedOffsets(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			e := memEngine(b)
			if s.new != nil {
				e = newEngine(b, s.new(b), idem.Config{Lease: 30 * time.Second})
			}
			_, opts := benchTopic(b)
			var n atomic.Int64
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			c, err := idemkafka.New(e, &idemkafka.Config{Operation: "ship", MaxPollRecords: benchPoll,
				Settled: func(_ *kgo.Record, v consume.Verdict) {
					if v.Action == consume.Done && n.Add(1) == int64(b.N) {
						stop()
					}
				},
			}, func(context.Context, *kgo.Record) (struct{}, error) { return struct{}{}, nil }, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			measure(b, s.redis, func() {
				if err := c.Run(ctx); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkConsumeHandDedup: the same records consumed by the dedup a team
// writes by hand instead of idemkafka (handdedup), on the same Redis: per
// poll (100 records), one pipeline of SET NX per record, the handlers of
// the records it claimed, one pipeline of SET per outcome, then the poll's
// offsets committed. It has none of idem's guarantees; compare its
// records/s and CPU per record with BenchmarkConsume's idemkafka+redis.
func BenchmarkConsumeHandDedup(b *testing.B) {
	b.Run("redis", func(b *testing.B) {
		rc := redis.NewClient(&redis.Options{Addr: testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")})
		defer rc.Close()
		d, err := handdedup.New(rc, fmt.Sprintf("idemkafka-hand-%d:", rand.Uint64()), time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		_, opts := benchTopic(b)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		handle := func(*kgo.Record) ([]byte, error) { return []byte("{}"), nil }
		n := 0
		measure(b, benchkit.StoreRedis(), func() {
			for n < b.N {
				fs := cl.PollRecords(ctx, benchPoll)
				if errs := fs.Errors(); len(errs) > 0 {
					b.Fatal(errs[0].Err)
				}
				recs := fs.Records()
				keys := make([]string, len(recs))
				for i, r := range recs {
					keys[i] = string(r.Key)
				}
				st, err := d.Batch(ctx, keys, func(i int) ([]byte, error) { return handle(recs[i]) })
				if err != nil {
					b.Fatal(err)
				}
				for i, s := range st {
					if s != handdedup.Ran {
						b.Fatalf("record %s: %v; every record of the benchmark is new and succeeds", keys[i], s)
					}
				}
				n += len(st)
				if err := cl.CommitUncommittedOffsets(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// measure runs consume, which returns once b.N records are settled, and
// reports records per second (msgs/s) and the CPU per record of this
// process and of the Redis at redisAddr ("" for none: a store on DynamoDB
// or PostgreSQL, whose server's CPU is not read).
func measure(b *testing.B, redisAddr string, consume func()) {
	b.ResetTimer()
	cpu := benchkit.StartCPU(b, redisAddr, "")
	start := time.Now()
	consume()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	cpu.Report(b, b.N)
}

// dynamoBenchStore is a store on a fresh table of DynamoDB Local
// (IDEM_DYNAMODB_ENDPOINT: scripts/dynamodb-local run), deleted at
// cleanup.
func dynamoBenchStore(b *testing.B) store.Store {
	c := dynamotest.Client(b)
	b.Cleanup(dynamotest.Transport.CloseIdleConnections)
	s, err := dynamostore.New(c, dynamotest.Table(b, c, "idemkafka_bench_", dynamostore.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// pgBenchStore is a store on a fresh table of the PostgreSQL at
// IDEM_PG_ADDR (default 127.0.0.1:5432, database test), in a schema of
// its own dropped at cleanup.
func pgBenchStore(b *testing.B) store.Store {
	addr := testenv.Reach(b, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	user := os.Getenv("IDEM_PG_USER")
	if user == "" {
		user = "postgres"
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=10", user, addr))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	schema := fmt.Sprintf("idemkafkabench_%x", rand.Uint64())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			b.Errorf("drop schema %s: %v", schema, err)
		}
	})
	table := schema + ".records"
	if err := pgstore.Migrate(ctx, pool, table); err != nil {
		b.Fatal(err)
	}
	s, err := pgstore.New(pool, &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
