package pgstore_test

import (
	"context"
	"fmt"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// An engine over PostgreSQL: Open connects a pool, applies the schema
// migrations and owns the pool. The second call with the key replays the
// first one's result. (It needs a PostgreSQL at 127.0.0.1:5432, so it is
// compiled but not run by go test.)
func ExampleOpen() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close() // stops the reaper, closes the pool
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.Request{Operation: "send-invoice", Key: "invoice-7"}
	send := func(ctx context.Context) (string, error) { return "sent", nil }
	for range 2 {
		res, err := idem.Do(ctx, eng, req, send)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%t\n", res.Value, res.Replayed)
	}
}
