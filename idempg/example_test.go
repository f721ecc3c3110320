package idempg_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idempg"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// DoTx on the application's own pool: the order row and the record of the
// call commit in one transaction, so a retry finds either both or neither.
// The retry below replays the first result and inserts nothing. (It needs
// a PostgreSQL at 127.0.0.1:5432, so it is compiled but not run by go
// test.)
func ExampleDoTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, "idem_records"); err != nil { // New expects the table
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	store, err := pgstore.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close() // stops the reaper; the pool stays open
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.Request{Operation: "place-order", Key: "order-42", Payload: []byte(`{"amount":1200}`)}
	place := func(ctx context.Context, tx pgx.Tx) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, amount) VALUES ($1, $2)`, "order-42", 1200)
		return "order-42", err
	}
	for range 2 {
		res, err := idempg.DoTx(ctx, eng, store, req, place)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%t\n", res.Value, res.Replayed)
	}
}
