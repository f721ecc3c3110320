package idemamqp

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/store"
)

// HandleBatch is [Consumer.Handle] for deliveries received together: the
// keys are claimed together by [idem.DoBatch] (in one round trip on a
// store that claims in batches, as redisstore does), fn runs for each
// claimed delivery, concurrency at once (0: all; 1: in order), each under
// its own claim, and every delivery is settled by its own verdict exactly
// as Handle settles it as soon as its own outcome is recorded
// ([idem.BatchOptions] Answered), not when the batch is done, each with
// its own Ack, Reject or Nack: never an acknowledgement with
// multiple=true, which would settle deliveries whose outcome did not
// land. Every claim of the batch is held until its delivery runs: the
// leases of the deliveries waiting for their turn are renewed together,
// and one whose claim was lost while it waited (taken over by another
// consumer) does not run and is tried later (Leave), when it replays the
// new holder's outcome. The successes of the batch are written together
// (idem.DoBatch), each with its own fenced answer. A delivery
// without a key is rejected alone; a key named twice runs fn once, and the
// later copy answers as a concurrent call in one process does (DoBatch):
// it waits for the earlier (with the engine's Wait) and is acked, or is
// tried later as in progress. ss[i] is how ds[i] was settled, after
// Config.Settled was called for it.
//
// The deliveries to be tried later are settled concurrently, each on a
// goroutine of its own, so that their Backoff holds overlap and hold up
// no other delivery. HandleBatch returns when every delivery is
// settled.
func (c *Consumer) HandleBatch(ctx context.Context, ds []amqp.Delivery, concurrency int) (ss []Settlement) {
	ss = make([]Settlement, len(ds))
	ids := make([]idem.Identity, 0, len(ds))
	at := make([]int, 0, len(ds)) // at[j]: the delivery of ids[j]
	for i, d := range ds {
		id, s, ok := c.identity(ctx, d)
		if !ok {
			ss[i] = c.report(d, s)
			continue
		}
		ids = append(ids, id)
		at = append(at, i)
	}
	if len(ids) == 0 {
		return ss
	}
	var later sync.WaitGroup
	idem.DoBatch(ctx, c.eng, ids, &idem.BatchOptions[struct{}]{
		Concurrency: concurrency,
		// Each delivery is settled as soon as its own outcome is recorded;
		// one to be tried later is settled on a goroutine of its own, so
		// that its Backoff holds up neither the batch nor the others'.
		Answered: func(j int, res idem.Result[struct{}], err error) {
			i := at[j]
			switch consume.Decide(res, err, time.Time{}).Action { // the action does not depend on the time

			case consume.Done, consume.DeadLetter:
				ss[i] = c.report(ds[i], c.decided(ctx, ds[i], res, err))
			default:
				later.Go(func() { ss[i] = c.report(ds[i], c.decided(ctx, ds[i], res, err)) })
			}
		},
	}, func(ctx context.Context, j int) (struct{}, error) {
		return struct{}{}, c.fn(ctx, ds[at[j]])
	})
	later.Wait()
	return ss
}

// BatchArgs are the arguments of [Consumer.RunBatch].
type BatchArgs struct {
	// ConsumeArgs as for [Consumer.Run]; Concurrency is how many handlers
	// of one batch run at once (default 0: the whole batch).
	ConsumeArgs
	// Size is the most deliveries in one batch. Default 16
	// (consume.DefaultBatchSize, as for every idem consumer).
	Size int
	// Window bounds how long, after a batch's first delivery, RunBatch
	// waits for more than the channel holds at once before it handles
	// the batch it has (on the system clock, as every idem consumer forms its batches); a batch the channel fills
	// at once waits for nothing. Default 2ms (consume.DefaultBatchWait).
	Window time.Duration
	// Batches is how many batches are collected and handled at once, each
	// by a goroutine of its own: with 2, one batch is collected while
	// another is handled. The channel's prefetch count (QoS) is
	// Size × Batches. Default 2 (consume.DefaultBatches).
	Batches int
}

// RunBatch is [Consumer.Run] in batches: it consumes a.Queue on ch with
// manual acknowledgement, collects deliveries into batches of up to
// a.Size (those the channel already holds, and, when they are fewer,
// what arrives within a.Window of the first), and hands each to
// [Consumer.HandleBatch], on batch workers ([idem.WithBatchWorkers]) held for as long as
// RunBatch runs, so the engine's batch workers outlive each batch. It sets ch's prefetch count to a.Size ×
// a.Batches. It returns nil when ctx is done (after cancelling the
// consumer and letting the batches in hand finish, as Run lets its
// handlers) and an error when the channel closes.
func (c *Consumer) RunBatch(ctx context.Context, ch *amqp.Channel, a BatchArgs) error {
	b := consume.Batching{Size: a.Size, Wait: a.Window, Batches: a.Batches}.WithDefaults()
	a.Size, a.Window, a.Batches = b.Size, b.Wait, b.Batches
	switch {
	case a.Size < 0 || a.Window < 0 || a.Batches < 0 || a.Concurrency < 0:
		return fmt.Errorf("%w: idemamqp: BatchArgs Size %d, Window %v, Batches %d and Concurrency %d must not be negative", idem.ErrInvalidConfig, a.Size, a.Window, a.Batches, a.Concurrency)
	}
	deliveries, stop, err := c.consume(ctx, ch, a.ConsumeArgs, a.Size*a.Batches)
	if err != nil {
		return err
	}
	defer stop()
	bctx, stopWorkers := idem.WithBatchWorkers(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	for range a.Batches {
		wg.Go(func() {
			for {
				batch := consume.Collect(deliveries, a.Size, a.Window, store.SystemClock{})
				if len(batch) == 0 {
					return
				}
				c.HandleBatch(bctx, batch, a.Concurrency)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("idemamqp: deliveries of %s stopped: %w", a.Queue, amqp.ErrClosed)
}
