package idemwatermill_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A router that ships each order once, however often it is published. By
// default a message's key is its payload, under the topic: a producer's
// retry publishes the same bytes (with a new UUID, as Watermill's
// publishers give one each time), so it is a duplicate. The Pub/Sub here
// is Watermill's in-process Go channel; any other is used the same way.
func ExampleAddConsumerHandler() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubSub.Close()

	st := memstore.New(nil) // in production: redisstore, pgstore, ...
	defer st.Close()
	engine, _ := idem.New(st, &idem.Config{Lease: time.Minute})

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	settled := make(chan consume.Verdict)
	_, err := idemwatermill.AddConsumerHandler(router, engine, &idemwatermill.Config{
		Operation: "orders.ship",
		Settled:   func(_ *message.Message, v consume.Verdict) { settled <- v },
	}, "shipper", "orders", pubSub, func(m *message.Message) error {
		fmt.Printf("shipping %s\n", m.Payload)
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	go router.Run(context.Background())
	defer router.Close()
	<-router.Running()

	// The producer publishes order 42 twice (a retry after a timeout).
	for range 2 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42,"item":"book"}`))
		pubSub.Publish("orders", m)
		fmt.Println("settled:", (<-settled).Action)
	}
	// Output:
	// shipping {"order":42,"item":"book"}
	// settled: done
	// settled: done
}
