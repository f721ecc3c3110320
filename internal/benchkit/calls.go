package benchkit

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/seed-a1b882c0/idem"
)

// Receipt is the result every store benchmark stores: a small JSON object.
type Receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func charge(context.Context) (Receipt, error) { return Receipt{ID: "r-1", Amount: 1000}, nil }

// NewCalls runs b.N first calls of new keys through e from concurrency
// goroutines: claim, run, complete.
func NewCalls(b *testing.B, e *idem.Engine, concurrency int) {
	b.Helper()
	Run(b, concurrency, func(i int) error {
		_, err := idem.Do(context.Background(), e, idem.Request{Scope: "charge", Key: strconv.Itoa(i)}, charge)
		return err
	})
}

// DuplicateCalls completes keys new keys through e, then runs b.N calls
// over them from concurrency goroutines; each must be a replay.
func DuplicateCalls(b *testing.B, e *idem.Engine, concurrency, keys int) {
	b.Helper()
	for i := range keys {
		if _, err := idem.Do(context.Background(), e, idem.Request{Scope: "charge", Key: strconv.Itoa(i)}, charge); err != nil {
			b.Fatal(err)
		}
	}
	Run(b, concurrency, func(i int) error {
		r, err := idem.Do(context.Background(), e, idem.Request{Scope: "charge", Key: strconv.Itoa(i % keys)}, charge)
		if err == nil && !r.Replayed {
			err = fmt.Errorf("call %d was not a replay", i)
		}
		return err
	})
}
