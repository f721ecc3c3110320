package idemkafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A consumer that ships each order once, however often it is produced. By
// default a record's key is its value, under its topic: a producer's
// retry sends the same bytes, so it is a duplicate, in whichever partition
// it lands. (The record's Kafka key here is the customer, shared by many
// orders: it names no one message. A producer that names each message,
// in a header such as Order-Id, can key by it with Config.KeyHeader.) The
// cluster is kfake, an emulator in this process; in production, your
// brokers.
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()

	// The producer sends order 42 twice (a retry after a timeout), then 43.
	producer, _ := kgo.NewClient(kgo.SeedBrokers(seeds...))
	defer producer.Close()
	order := func(id, body string) *kgo.Record {
		return &kgo.Record{Topic: "orders", Key: []byte("customer-7"), Value: []byte(body),
			Headers: []kgo.RecordHeader{{Key: "Order-Id", Value: []byte(id)}}}
	}
	err = producer.ProduceSync(context.Background(),
		order("42", `{"order":42,"item":"book"}`),
		order("42", `{"order":42,"item":"book"}`),
		order("43", `{"order":43,"item":"lamp"}`),
	).FirstErr()
	if err != nil {
		fmt.Println(err)
		return
	}

	st := memstore.New(nil) // in production: redisstore, pgstore, ...
	defer st.Close()
	engine, _ := idem.New(st, &idem.Config{Lease: time.Minute})

	ctx, stop := context.WithCancel(context.Background())
	var settled []string
	c, err := idemkafka.New(engine, &idemkafka.Config{
		Operation: "orders.ship",
		Settled: func(r *kgo.Record, v consume.Verdict) {
			settled = append(settled, fmt.Sprint("offset ", r.Offset, ": ", v.Action))
			if len(settled) == 3 {
				stop() // for the example: Run until three records are settled
			}
		},
	}, func(ctx context.Context, r *kgo.Record) (string, error) {
		fmt.Printf("shipping %s\n", r.Value)
		return "tracking-1", nil
	},
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup("shipper"),
		kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
	}
	for _, s := range settled {
		fmt.Println(s)
	}
	// Output:
	// shipping {"order":42,"item":"book"}
	// shipping {"order":43,"item":"lamp"}
	// offset 0: done
	// offset 1: done
	// offset 2: done
}
