// Command charge shows one payment executed once: a client that times out
// and retries, and a burst of concurrent duplicates of the same request,
// all against one idempotency key, on the embedded file store. The bank is
// charged exactly once and every caller gets the same receipt.
//
//	go run ./examples/charge                  # a fresh store file each run
//	go run ./examples/charge -db ./idem.db    # run twice: the second run replays from disk
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

type chargeRequest struct {
	OrderID  string `json:"order_id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

type receipt struct {
	ChargeID string `json:"charge_id"`
	Amount   int    `json:"amount"`
}

// bank stands for the payment provider: slow, and it counts real charges.
type bank struct{ charges atomic.Int64 }

func (b *bank) charge(ctx context.Context, r chargeRequest) (receipt, error) {
	select {
	case <-time.After(150 * time.Millisecond):
	case <-ctx.Done():
		return receipt{}, ctx.Err()
	}
	n := b.charges.Add(1)
	return receipt{ChargeID: fmt.Sprintf("ch_%s_%d", r.OrderID, n), Amount: r.Amount}, nil
}

func main() {
	dupes := flag.Int("duplicates", 8, "concurrent duplicates of the request")
	db := flag.String("db", "", "store file (default: a new file in a temporary directory)")
	flag.Parse()
	if *db == "" {
		dir, err := os.MkdirTemp("", "idem-charge")
		if err != nil {
			fmt.Fprintln(os.Stderr, "charge:", err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		*db = dir + "/idem.db"
	}
	if err := run(*dupes, *db); err != nil {
		fmt.Fprintln(os.Stderr, "charge:", err)
		os.Exit(1)
	}
}

func run(dupes int, path string) error {
	_, statErr := os.Stat(path)
	fresh := os.IsNotExist(statErr)
	store, err := boltstore.Open(path, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	fmt.Printf("store: %s (fresh=%v)\n", path, fresh)
	eng, err := idem.New(store, &idem.Config{
		Wait:   5 * time.Second, // duplicates wait for the first call's result
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	b := &bank{}
	charge, err := idem.NewOp(eng, "charge", b.charge, &idem.OpConfig[chargeRequest, receipt]{
		Key: func(r chargeRequest) (string, error) { return r.OrderID, nil },
	})
	if err != nil {
		return err
	}
	req := chargeRequest{OrderID: "order-42", Amount: 1999, Currency: "EUR"}

	// 1. A client with a 50ms timeout gives up while the bank is still
	// working, and retries. The first attempt's claim is released when its
	// context ends; the retry runs the charge.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = charge.Do(ctx, req)
	cancel()
	fmt.Printf("attempt 1: %v\n", err)

	// 2. Retry, racing with a burst of concurrent duplicates.
	var wg sync.WaitGroup
	results := make([]string, dupes+1)
	for i := range dupes + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := charge.Do(context.Background(), req)
			if err != nil {
				results[i] = "error: " + err.Error()
				return
			}
			results[i] = fmt.Sprintf("%s (replayed=%v)", res.Value.ChargeID, res.Replayed)
		}()
	}
	wg.Wait()
	for i, r := range results {
		fmt.Printf("caller %d: %s\n", i+1, r)
	}

	// 3. The same key with a different amount is refused.
	_, err = charge.Do(context.Background(), chargeRequest{OrderID: "order-42", Amount: 5, Currency: "EUR"})
	fmt.Printf("same key, other amount: mismatch=%v\n", errors.Is(err, idem.ErrMismatch))

	fmt.Printf("bank charges this run: %d\n", b.charges.Load())
	want := int64(1)
	if !fresh {
		want = 0 // an earlier run's charge is replayed from the file
	}
	if b.charges.Load() > want {
		return fmt.Errorf("the bank was charged %d times", b.charges.Load())
	}
	return nil
}
