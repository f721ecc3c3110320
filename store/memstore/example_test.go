package memstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// An engine over an in-memory store: the second call with the key replays
// the first one's result.
func ExampleNew() {
	store := memstore.New(nil)
	defer store.Close() // stops the sweeper
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.Request{Operation: "send-invoice", Key: "invoice-7"}
	send := func(ctx context.Context) (string, error) { return "sent", nil }
	for range 2 {
		res, err := idem.Do(context.Background(), eng, req, send)
		fmt.Printf("%s replayed=%t err=%v\n", res.Value, res.Replayed, err)
	}
	// Output:
	// sent replayed=false err=<nil>
	// sent replayed=true err=<nil>
}

// A full store refuses new keys instead of evicting live records; the call
// fails closed and its operation does not run.
func ExampleNew_maxRecords() {
	store := memstore.New(&memstore.Config{MaxRecords: 1})
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	ran := 0
	op := func(ctx context.Context) (int, error) { ran++; return ran, nil }
	for _, key := range []string{"a", "b", "a"} {
		_, err := idem.Do(context.Background(), eng, idem.Request{Operation: "job", Key: key}, op)
		fmt.Printf("%s: full=%t\n", key, errors.Is(err, memstore.ErrFull))
	}
	fmt.Println("runs:", ran)
	// Output:
	// a: full=false
	// b: full=true
	// a: full=false
	// runs: 1
}
