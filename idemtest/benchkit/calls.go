package benchkit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
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
		_, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, charge)
		return err
	})
}

// DuplicateCalls completes keys new keys through e, then runs b.N calls
// over them from concurrency goroutines; each must be a replay.
func DuplicateCalls(b *testing.B, e *idem.Engine, concurrency, keys int) {
	b.Helper()
	for i := range keys {
		if _, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, charge); err != nil {
			b.Fatal(err)
		}
	}
	Run(b, concurrency, func(i int) error {
		r, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: strconv.Itoa(i % keys)}, charge)
		if err == nil && !r.Replayed {
			err = fmt.Errorf("call %d was not a replay", i)
		}
		return err
	})
}

// Engine returns a benchmark engine over s: quiet logger, no lease renewal.
func Engine(b *testing.B, s store.Store) *idem.Engine {
	b.Helper()
	e, err := idem.New(s, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RenewInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// NewCallBenchmarks runs NewCalls as sub-benchmarks c=N, one fresh store
// (from newStore) per concurrency.
func NewCallBenchmarks(b *testing.B, newStore func(b *testing.B) store.Store, concurrency ...int) {
	for _, c := range concurrency {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { NewCalls(b, Engine(b, newStore(b)), c) })
	}
}

// DuplicateCallBenchmarks runs DuplicateCalls over keys as sub-benchmarks
// c=N, one fresh store per concurrency.
func DuplicateCallBenchmarks(b *testing.B, newStore func(b *testing.B) store.Store, keys int, concurrency ...int) {
	for _, c := range concurrency {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { DuplicateCalls(b, Engine(b, newStore(b)), c, keys) })
	}
}
