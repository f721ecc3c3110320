package idemlambda_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// gatedComplete holds the first Complete until gate is closed.
type gatedComplete struct {
	*faultstore.Store
	gate  chan struct{}
	first atomic.Bool
}

func (g *gatedComplete) Complete(ctx context.Context, p store.CompleteParams) error {
	if g.first.CompareAndSwap(false, true) {
		<-g.gate
	}
	return g.Store.Complete(ctx, p)
}

// TestStreamClaimsTogetherInOrder: a shard's batch claims its records'
// keys in one store call, runs the handlers one at a time in the shard's
// order, and does not wait for a record's outcome write before the next
// record's handler: the first record's Complete is held until the second
// handler has run. Every record is recorded (a redelivery runs nothing).
func TestStreamClaimsTogetherInOrder(t *testing.T) {
	t.Parallel()
	for _, src := range streamSources() {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			mem := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { _ = mem.Close() })
			fs := faultstore.New(mem)
			st := &gatedComplete{Store: fs, gate: make(chan struct{})}
			eng, err := idem.New(st, &idem.Config{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			rs := shard(40)
			var (
				mu      sync.Mutex
				order   []string
				running atomic.Int32
			)
			deliver := src.open(t, eng, streamOpts{}, func(_ context.Context, r rec) error {
				if n := running.Add(1); n != 1 {
					t.Errorf("record %s: %d handlers at once, want one", r.seq, n)
				}
				mu.Lock()
				order = append(order, r.seq)
				mu.Unlock()
				if r.seq == rs[1].seq {
					close(st.gate) // the first record's outcome write was held until now
				}
				running.Add(-1)
				return nil
			})
			ctx := context.Background()
			if failed := deliver(ctx, rs); failed != nil {
				t.Fatalf("reported %v", failed)
			}
			if !slices.Equal(order, seqs(rs)) {
				t.Fatalf("ran %v, want the shard's order", order)
			}
			if b, c := fs.Calls("claim_batch"), fs.Calls("claim"); b != 1 || c != 0 {
				t.Errorf("%d batch claims and %d single claims, want the batch's keys in one call", b, c)
			}
			if failed := deliver(ctx, rs); failed != nil || len(order) != len(rs) {
				t.Fatalf("redelivery: reported %v, %d runs in all", failed, len(order))
			}
		})
	}
}
