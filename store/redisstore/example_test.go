package redisstore_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// An engine over Redis, connected by URL; the store owns the client. The
// second call with the key replays the first one's result. (It needs a
// Redis at 127.0.0.1:6379, so it is compiled but not run by go test.)
func ExampleOpen() {
	store, err := redisstore.Open("redis://127.0.0.1:6379/0", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close() // closes the client it opened
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.Request{Operation: "send-invoice", Key: "invoice-7"}
	send := func(ctx context.Context) (string, error) { return "sent", nil }
	for range 2 {
		res, err := idem.Do(context.Background(), eng, req, send)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%t\n", res.Value, res.Replayed)
	}
}

// The store on a client of the caller's (here a plain client; a cluster,
// ring or failover client works as well), its keys under a prefix of their
// own. Close leaves the client open: it belongs to the caller.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "billing:idem:"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	res, err := idem.Do(context.Background(), eng, idem.Request{Operation: "refund", Key: "order-42"},
		func(ctx context.Context) (int, error) { return 1200, nil })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("refunded %d replayed=%t\n", res.Value, res.Replayed)
}
