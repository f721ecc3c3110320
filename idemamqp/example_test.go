package idemamqp_test

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemamqp"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// An idempotent consumer: the same order published twice under one
// MessageId ships once, and both copies are acknowledged. Retries go
// through a delay queue. (It needs a RabbitMQ at 127.0.0.1:5672, so go test
// compiles it and TestExample runs it when the broker is there.)
func Example() {
	addr := os.Getenv("IDEM_AMQP_ADDR")
	if addr == "" {
		addr = "127.0.0.1:5672"
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel() // consumes
	if err != nil {
		fmt.Println(err)
		return
	}
	pubCh, err := conn.Channel() // publishes to the delay queue, in confirm mode
	if err != nil {
		fmt.Println(err)
		return
	}
	const queue = "idemamqp-example-orders"
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		fmt.Println(err)
		return
	}
	defer ch.QueueDelete(queue+".idem-delay", false, false, false)
	defer ch.QueueDelete(queue, false, false, false)
	delay, err := idemamqp.DeclareDelay(pubCh, queue, 5*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}

	store := memstore.New(nil) // redisstore, pgstore, ... in production
	defer store.Close()
	eng, err := idem.New(store, &idem.Config{Lease: time.Minute}) // below consumer_timeout
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan struct{}, 2)
	c, err := idemamqp.New(eng, &idemamqp.Config{
		Operation: "ship-order",
		Delay:     delay,
		Settled: func(d amqp.Delivery, s idemamqp.Settlement) {
			fmt.Printf("%s: %s replayed=%t\n", d.MessageId, s.Action, s.Replayed)
			done <- struct{}{}
		},
	}, func(ctx context.Context, d amqp.Delivery) error {
		fmt.Printf("shipping %s\n", d.Body)
		return nil // idem.Terminal(err, code) to dead-letter; any other error retries later
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx, ch, idemamqp.ConsumeArgs{Queue: queue, Concurrency: 1}) }()
	for range 2 {
		err := pubCh.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: "order-42", Body: []byte(`{"order":42}`),
		})
		if err != nil {
			fmt.Println(err)
		}
	}
	<-done
	<-done
	cancel()
	if err := <-stopped; err != nil {
		fmt.Println(err)
	}
	// It prints (TestExample checks it):
	//
	//	shipping {"order":42}
	//	order-42: acked replayed=false
	//	order-42: acked replayed=true
}
