package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A charge retried three times runs once; the retries replay its result.
func ExampleDo() {
	store := memstore.New(nil)
	defer store.Close()
	eng, _ := idem.New(store, nil)

	charges := 0
	charge := func(ctx context.Context) (string, error) {
		charges++
		return "receipt-1", nil
	}
	req := idem.Request{Operation: "charge", Key: "order-42", Payload: []byte(`{"amount":1000,"currency":"EUR"}`)}
	for range 3 {
		res, err := idem.Do(context.Background(), eng, req, charge)
		fmt.Println(res.Value, res.Replayed, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// receipt-1 false <nil>
	// receipt-1 true <nil>
	// receipt-1 true <nil>
	// charges: 1
}

// Reusing a key with a different payload is refused.
func ExampleMismatchError() {
	store := memstore.New(nil)
	defer store.Close()
	eng, _ := idem.New(store, nil)
	ctx := context.Background()
	ok := func(context.Context) (int, error) { return 1, nil }

	_, _ = idem.Do(ctx, eng, idem.Request{Operation: "charge", Key: "k", Payload: []byte(`{"amount":10}`)}, ok)
	_, err := idem.Do(ctx, eng, idem.Request{Operation: "charge", Key: "k", Payload: []byte(`{"amount":99}`)}, ok)
	fmt.Println(errors.Is(err, idem.ErrMismatch))
	// Output: true
}

// A terminal error is stored and replayed; the operation does not run again.
func ExampleTerminal() {
	store := memstore.New(nil)
	defer store.Close()
	eng, _ := idem.New(store, nil)
	ctx := context.Background()
	declined := func(context.Context) (string, error) {
		return "", idem.Terminal(errors.New("card declined"), "card_declined")
	}
	for range 2 {
		_, err := idem.Do(ctx, eng, idem.Request{Operation: "charge", Key: "k"}, declined)
		var te *idem.TerminalError
		errors.As(err, &te)
		fmt.Println(te.Code, te.Replayed)
	}
	// Output:
	// card_declined false
	// card_declined true
}

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// A typed operation takes its key from the input.
func ExampleNewOp() {
	store := memstore.New(nil)
	defer store.Close()
	eng, _ := idem.New(store, nil)

	var mu sync.Mutex
	shipped := 0
	ship, _ := idem.NewOp(eng, "ship", func(ctx context.Context, o order) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		shipped++
		return "parcel-for-" + o.ID, nil
	}, &idem.OpConfig[order, string]{Key: func(o order) (string, error) { return o.ID, nil }})

	var wg sync.WaitGroup
	for range 5 { // five concurrent duplicates
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := ship.Do(context.Background(), order{ID: "o-7", Amount: 3}); !errors.Is(err, idem.ErrInProgress) {
					return
				}
			}
		}()
	}
	wg.Wait()
	res, _ := ship.Do(context.Background(), order{ID: "o-7", Amount: 3})
	fmt.Println(res.Value, res.Replayed, shipped)
	// Output: parcel-for-o-7 true 1
}

// The operation's context carries its claim, and a downstream key that stays
// the same across retries and takeovers.
func ExampleClaim_DownstreamKey() {
	store := memstore.New(nil)
	defer store.Close()
	eng, _ := idem.New(store, nil)
	req := idem.Request{Operation: "charge", Key: "order-42"}
	var keys []string
	for range 2 {
		_, _ = idem.Do(context.Background(), eng, req, func(ctx context.Context) (int, error) {
			c, _ := idem.FromContext(ctx)
			keys = append(keys, c.DownstreamKey("bank-api"))
			return 0, errors.New("bank timed out") // retryable: released
		})
	}
	fmt.Println(len(keys[0]), keys[0] == keys[1])
	// Output: 32 true
}
