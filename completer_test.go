package idem

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// gateStore is memstore whose Completes can be held at a gate and whose
// batch completes are counted, and can fail once as a lost round trip.
type gateStore struct {
	*memstore.Store
	gate chan struct{} // a Complete waits for it while not nil

	mu       sync.Mutex
	alone    int     // Completes made one by one
	batches  [][]int // the size of each CompleteBatch
	failNext bool    // the next CompleteBatch fails as a whole
}

func (g *gateStore) Complete(ctx context.Context, p store.CompleteParams) error {
	g.mu.Lock()
	g.alone++
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.Store.Complete(ctx, p)
}

func (g *gateStore) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	g.mu.Lock()
	g.batches = append(g.batches, []int{len(ps)})
	fail := g.failNext
	g.failNext = false
	g.mu.Unlock()
	if fail {
		errs := make([]error, len(ps))
		for i := range errs {
			errs[i] = fmt.Errorf("connection reset: %w", store.ErrUnavailable)
		}
		return errs
	}
	return g.Store.CompleteBatch(ctx, ps)
}

// queued waits until n Completes wait behind the one in flight.
func queued(e *Engine, n int) {
	for {
		e.completer.mu.Lock()
		l := len(e.completer.queue)
		e.completer.mu.Unlock()
		if l >= n {
			return
		}
		runtime.Gosched()
	}
}

// TestCompletesThatFinishTogetherShareABatch: a Complete made while none is
// in flight goes alone; those made while it is in flight go together in one
// CompleteBatch, each recorded with its own result; a batch that fails as a
// whole fails each write alone, and each holder retries its own.
func TestCompletesThatFinishTogetherShareABatch(t *testing.T) {
	for _, failBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch-fails-once=%v", failBatch), func(t *testing.T) {
			mem := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { _ = mem.Close() })
			g := &gateStore{Store: mem, gate: make(chan struct{}), failNext: failBatch}
			e, err := New(g, &Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if e.completer == nil {
				t.Fatal("the engine does not batch the Completes of a store.BatchCompleter")
			}
			ctx := context.Background()
			do := func(key string) (Result[string], error) {
				return Do(ctx, e, Request{Operation: "batch", Key: key}, func(context.Context) (string, error) { return "r-" + key, nil })
			}
			type answer struct {
				res Result[string]
				err error
			}
			first := make(chan answer, 1)
			go func() { r, err := do("a"); first <- answer{r, err} }()
			// "a" holds the slot at the gate; b, c and d queue behind it.
			for {
				g.mu.Lock()
				n := g.alone
				g.mu.Unlock()
				if n == 1 {
					break
				}
				runtime.Gosched()
			}
			rest := make(chan answer, 3)
			for _, k := range []string{"b", "c", "d"} {
				go func() { r, err := do(k); rest <- answer{r, err} }()
			}
			queued(e, 3)
			g.mu.Lock()
			gate := g.gate
			g.gate = nil
			g.mu.Unlock()
			close(gate)
			got := map[string]bool{}
			for _, ch := range []chan answer{first, rest, rest, rest} {
				a := <-ch
				if a.err != nil || a.res.Recorded != store.StatusCompleted {
					t.Errorf("answer %q: Recorded %v, err %v; want COMPLETED", a.res.Value, a.res.Recorded, a.err)
				}
				got[a.res.Value] = true
			}
			for _, k := range []string{"a", "b", "c", "d"} {
				if !got["r-"+k] {
					t.Errorf("no call answered r-%s: %v", k, got)
				}
				req := Request{Operation: "batch", Key: k}
				id, _ := req.Identity()
				r, err := mem.Get(ctx, id.StoreKey.String())
				if err != nil || r.Status != store.StatusCompleted || string(r.Result) != `"r-`+k+`"` {
					t.Errorf("record of %s: %+v, %v; want COMPLETED with its own result", k, r, err)
				}
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.batches) == 0 || g.batches[0][0] != 3 {
				t.Fatalf("batches %v: want the three queued Completes in one batch first", g.batches)
			}
			// Every write that landed: "a" alone, then the batch of three —
			// or, when that batch failed, each of the three once more.
			if landed := g.alone + sumBatches(g.batches[1:]); failBatch && landed != 1+3 || !failBatch && (g.alone != 1 || len(g.batches) != 1) {
				t.Errorf("%d Completes alone, batches %v (batch failed once: %v)", g.alone, g.batches, failBatch)
			}
		})
	}
}

func sumBatches(bs [][]int) int {
	n := 0
	for _, b := range bs {
		n += b[0]
	}
	return n
}

// slowStore is memstore whose lone Completes take a while (on the bubble's
// clock) and whose batch completes report their context's error.
type slowStore struct {
	*memstore.Store
	took, batchTook time.Duration

	mu      sync.Mutex
	batchOK []bool // per CompleteBatch: every write landed
}

func (s *slowStore) Complete(ctx context.Context, p store.CompleteParams) error {
	time.Sleep(s.took)
	return s.Store.Complete(ctx, p)
}

func (s *slowStore) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	time.Sleep(s.batchTook)
	errs := s.Store.CompleteBatch(ctx, ps)
	ok := true
	for _, err := range errs {
		ok = ok && err == nil
	}
	s.mu.Lock()
	s.batchOK = append(s.batchOK, ok)
	s.mu.Unlock()
	return errs
}

// TestABatchGetsAFreshAttempt: Completes that queued behind a slow one wait
// longer than one attempt of an outcome write may take (WriteTimeout/3);
// the batch that carries them still gets a whole attempt when it is sent,
// so a slow but healthy store loses no outcome.
func TestABatchGetsAFreshAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		defer mem.Close()
		// An attempt may take 100ms. The lone Complete takes 80ms; those
		// queued behind it from 1-3ms have 20ms of their own attempts left
		// when their batch is sent, and the batch takes 50ms.
		s := &slowStore{Store: mem, took: 80 * time.Millisecond, batchTook: 50 * time.Millisecond}
		e, err := New(s, &Config{WriteTimeout: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		results := make([]Result[string], 4)
		for i := range results {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond) // the first goes alone, the others queue behind it
				results[i], _ = Do(context.Background(), e, Request{Operation: "slow", Key: fmt.Sprint(i)}, func(context.Context) (string, error) { return "v", nil })
			})
		}
		wg.Wait()
		for i, r := range results {
			if r.Recorded != store.StatusCompleted || r.Unrecorded != nil {
				t.Errorf("call %d: Recorded %v, Unrecorded %v; want COMPLETED", i, r.Recorded, r.Unrecorded)
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.batchOK) != 1 || !s.batchOK[0] {
			t.Errorf("batches %v: want one, every write landed at its first attempt", s.batchOK)
		}
	})
}
