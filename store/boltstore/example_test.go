package boltstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// An engine over a store file. The outcome is on disk when the call
// returns: a process that opens the file again (here, the second run)
// replays it instead of charging twice.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "idem.db") // in a service: boltstore.DefaultPath()

	charges := 0
	run := func() error {
		store, err := boltstore.Open(path, nil)
		if err != nil {
			return err
		}
		defer store.Close() // stops the sweeper, closes the file
		eng, err := idem.New(store, nil)
		if err != nil {
			return err
		}
		res, err := idem.Do(context.Background(), eng, idem.Request{Operation: "charge", Key: "order-42"},
			func(ctx context.Context) (string, error) {
				charges++
				return "receipt-1", nil
			})
		if err != nil {
			return err
		}
		fmt.Printf("%s replayed=%t\n", res.Value, res.Replayed)
		return nil
	}
	for range 2 {
		if err := run(); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("charges:", charges)
	// Output:
	// receipt-1 replayed=false
	// receipt-1 replayed=true
	// charges: 1
}
