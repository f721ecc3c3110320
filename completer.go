// The completer: Completes of calls that finish together share one round
// trip on a store.BatchCompleter, without a timer.

package idem

import (
	"context"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// completer coalesces the Completes of calls that finish together into
// one CompleteBatch of a store that can batch them ([store.BatchCompleter]).
// No timer: a Complete made while none is in flight goes alone, at once;
// those made while one is in flight wait for it and then go together, the
// first of them sending the batch. Each keeps its own answer: the store
// checks every Complete's own fence and owner, and a failure of the round
// trip is each one's error, which its holder retries on its own.
type completer struct {
	s store.Store
	b store.BatchCompleter // s
	// attempt is the time one attempt of an outcome write may take
	// (a third of Config.WriteTimeout, at most half of Config.Lease but a
	// second at least): a batch gets it afresh when it is sent, as
	// its members waited for the write in flight before it.
	attempt time.Duration
	mu      sync.Mutex
	busy    bool               // a Complete or batch is in flight
	queue   []*pendingComplete // waiting for it, in arrival order
}

// pendingComplete is one Complete waiting for a batch.
type pendingComplete struct {
	p     store.CompleteParams
	err   error
	done  chan struct{}      // closed when answered, or when it sends the batch
	batch []*pendingComplete // set on the one that sends the batch
}

// complete makes the Complete p, alone or in a batch.
func (c *completer) complete(ctx context.Context, p store.CompleteParams) error {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		defer c.next()
		return c.s.Complete(ctx, p)
	}
	w := &pendingComplete{p: p, done: make(chan struct{})}
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	<-w.done
	if w.batch == nil {
		return w.err
	}
	return c.send(ctx, w.batch)
}

// send makes the Completes of batch in one CompleteBatch, answers the
// others and returns the first's answer. Whatever happens, every waiter is
// answered and the slot handed on.
func (c *completer) send(ctx context.Context, batch []*pendingComplete) (err error) {
	answered := false
	defer func() {
		if !answered { // the store panicked: the others must not wait forever
			for _, b := range batch[1:] {
				b.err = &store.CorruptError{Key: b.p.Key, Reason: "the batch complete carrying this write did not return"}
				close(b.done)
			}
		}
		c.next()
	}()
	ps := make([]store.CompleteParams, len(batch))
	for i, b := range batch {
		ps[i] = b.p
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.attempt)
	defer cancel()
	errs := c.b.CompleteBatch(bctx, ps)
	_ = batchAnswers(&errs, len(ps), ps[0].Key, "complete")
	for i, b := range batch[1:] {
		b.err = errs[i+1]
		close(b.done)
	}
	answered = true
	return errs[0]
}

// next hands the in-flight slot to the Completes that queued meanwhile:
// the first of them sends them all.
func (c *completer) next() {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	batch := c.queue
	c.queue = nil
	c.mu.Unlock()
	batch[0].batch = batch
	close(batch[0].done)
}
