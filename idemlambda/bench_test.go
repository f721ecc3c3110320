package idemlambda_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// BenchmarkSQSBatch measures the latency of one SQS batch of new records
// over Redis with 2 ms added to every reply (a store one network hop
// away): a batch of 10 should cost about the two round trips of one record
// (claim, complete), not twenty.
//
//	cd idemlambda && go test -run '^$' -bench SQSBatch -benchtime 50x
func BenchmarkSQSBatch(b *testing.B) {
	addr := testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer px.Close()
	px.SetLatency(2 * time.Millisecond)
	store, err := redisstore.Open("redis://"+px.Addr()+"/0", &redisstore.Config{Prefix: fmt.Sprintf("sqsbench-%d:", time.Now().UnixNano())})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	eng, err := idem.New(store, &idem.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	h, err := idemlambda.SQS(eng, "bench", func(context.Context, events.SQSMessage) error { return nil }, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			seq := 0
			for b.Loop() {
				var ev events.SQSEvent
				for range n {
					seq++
					ev.Records = append(ev.Records, events.SQSMessage{MessageId: fmt.Sprintf("%d-%d", n, seq), EventSourceARN: "arn:aws:sqs:eu-west-1:1:q"})
				}
				r, err := h(context.Background(), ev)
				if err != nil || len(r.BatchItemFailures) != 0 {
					b.Fatalf("%v %v", r, err)
				}
			}
		})
	}
}

// BenchmarkKinesisBatch measures the latency of one Kinesis batch of new
// records over Redis with 2 ms added to every reply: the batch's keys are
// claimed in one call and the handlers run one after the other, each
// record's outcome write overlapping the next handler; replays=true
// measures the same batch delivered again (the batch claim answers every
// record). ms/record is the batch's time over its records.
//
//	cd idemlambda && go test -run '^$' -bench KinesisBatch -benchtime 50x
func BenchmarkKinesisBatch(b *testing.B) {
	addr := testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer px.Close()
	px.SetLatency(2 * time.Millisecond)
	store, err := redisstore.Open("redis://"+px.Addr()+"/0", &redisstore.Config{Prefix: fmt.Sprintf("kinesisbench-%d:", time.Now().UnixNano())})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	eng, err := idem.New(store, &idem.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	h, err := idemlambda.Kinesis(eng, "bench", func(context.Context, events.KinesisEventRecord) error { return nil }, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 10, 100} {
		for _, replays := range []bool{false, true} {
			b.Run(fmt.Sprintf("records=%d/replays=%t", n, replays), func(b *testing.B) {
				seq := 0
				batch := func() events.KinesisEvent {
					var ev events.KinesisEvent
					for range n {
						seq++
						s := fmt.Sprintf("%d-%t-%d", n, replays, seq)
						ev.Records = append(ev.Records, events.KinesisEventRecord{EventID: "shardId-000000000000:" + s,
							EventSourceArn: "arn:aws:kinesis:eu-west-1:1:stream/s", Kinesis: events.KinesisRecord{SequenceNumber: s}})
					}
					return ev
				}
				ev := batch()
				if replays {
					if r, err := h(context.Background(), ev); err != nil || len(r.BatchItemFailures) != 0 {
						b.Fatalf("%v %v", r, err)
					}
				}
				for b.Loop() {
					if !replays {
						ev = batch()
					}
					r, err := h(context.Background(), ev)
					if err != nil || len(r.BatchItemFailures) != 0 {
						b.Fatalf("%v %v", r, err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N*n), "ms/record")
			})
		}
	}
}
