package idemnats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/store"
)

// ProcessBatch handles a batch of messages; see [WrapBatch]. ds[i] and
// errs[i] say what was done with msgs[i], as [Process] says for one.
type ProcessBatch func(ctx context.Context, msgs []jetstream.Msg) (ds []Disposition, errs []error)

// WrapBatch is [Wrap] for a batch of messages, as fetched together: the
// keys of the batch are claimed together by [idem.DoBatch] (in one round
// trip on a store that claims in batches, as redisstore does), fn runs for
// each claimed message, Config.Concurrency at once, each under its own
// claim, and each message is then settled by its own verdict, exactly as
// Wrap settles it. Every claim of the batch is held until its message
// runs: the leases of the messages waiting for their turn are renewed
// together, and a message whose claim was lost while it waited (taken
// over by another worker) does not run and is left to AckWait (Leave), so
// its redelivery replays the new holder's outcome. The successes of the
// batch are written together (idem.DoBatch), each with its own fenced
// answer. A message without a key
// is terminated alone; a key named twice in a batch runs fn once, and the
// later copy answers as a concurrent call in one process does (DoBatch):
// in progress, so NakWithDelay, when the engine does not wait (Wait 0),
// or, with a Wait, the earlier copy's outcome replayed. One message's
// failed write or settlement never settles another.
//
// Each message is settled as soon as its own outcome is recorded
// ([idem.BatchOptions] Answered), not when the whole batch has answered;
// until then it is kept from redelivery by msg.InProgress every Heartbeat
// (while it waits for its turn too), except one whose claim was lost
// while its fn ran. A deadline on ctx sets the claims' first lease; the
// engine renews the leases while fn runs, deadline or not.
func WrapBatch[T any](e *idem.Engine, cfg *Config, fn Func[T]) (ProcessBatch, error) {
	if e == nil || fn == nil {
		return nil, fmt.Errorf("%w: engine and handler are required", ErrInvalidConfig)
	}
	c := cfg.WithDefaults(e)
	if err := c.validate(e); err != nil {
		return nil, err
	}
	w := &wrapper[T]{e: e, cfg: c, fn: fn}
	return w.processBatch, nil
}

func (w *wrapper[T]) processBatch(ctx context.Context, msgs []jetstream.Msg) ([]Disposition, []error) {
	ds, errs := make([]Disposition, len(msgs)), make([]error, len(msgs))
	ids := make([]idem.Identity, 0, len(msgs))
	at := make([]int, 0, len(msgs)) // at[j]: the message of ids[j]
	for i, m := range msgs {
		id, err := w.identity(m)
		if err != nil {
			ds[i], errs[i] = w.settleVerdict(m, consume.Decide(idem.Result[T]{}, err, w.e.Now()))
			continue
		}
		ids = append(ids, id)
		at = append(at, i)
	}
	if len(ids) == 0 {
		return ds, errs
	}
	hb := w.heartbeats(ctx, msgs, at)
	defer hb.stop() // also when an fn panics: no heartbeat forever
	idem.DoBatch(ctx, w.e, ids, &idem.BatchOptions[T]{
		Concurrency: w.cfg.Concurrency,
		// Each message is settled as soon as its own outcome is recorded,
		// and gets no heartbeat after.
		Answered: func(j int, res idem.Result[T], err error) {
			i := at[j]
			hb.settled(j)
			ds[i], errs[i] = w.settleVerdict(msgs[i], consume.Decide(res, err, w.e.Now()))
		},
	}, func(ctx context.Context, j int) (T, error) {
		hb.running(j, ctx)
		defer hb.ran(j, ctx)
		return w.fn(ctx, msgs[at[j]])
	})
	return ds, errs
}

// batchBeat sends msg.InProgress every Heartbeat for each message of a
// batch until it is settled, but not for one whose fn's context ended
// (its claim was lost, or the caller gave up): that one is left to
// AckWait, as Wrap leaves it.
type batchBeat struct {
	mu   sync.Mutex
	ctxs []context.Context // the context fn(j) runs with, while it runs
	lost []bool            // no more heartbeats: the claim was lost, or the message settled
	done chan struct{}
	exit chan struct{}
}

func (w *wrapper[T]) heartbeats(ctx context.Context, msgs []jetstream.Msg, at []int) *batchBeat {
	b := &batchBeat{ctxs: make([]context.Context, len(at)), lost: make([]bool, len(at)), done: make(chan struct{}), exit: make(chan struct{})}
	go func() {
		defer close(b.exit)
		t := time.NewTicker(w.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-b.done:
				return
			case <-ctx.Done():
				return // the caller gave up: let AckWait run out
			case <-t.C:
				for j, i := range at {
					if err := b.beat(j, msgs[i]); err != nil {
						w.cfg.Logger.Warn("idemnats: InProgress failed", "op", w.cfg.Operation, "err", err)
					}
				}
			}
		}
	}()
	return b
}

// beat sends m.InProgress for the message of fn(j), unless it is settled
// or its claim was lost: under b.mu, so that no InProgress follows its
// settlement (settled).
func (b *batchBeat) beat(j int, m jetstream.Msg) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.ctxs[j]; c != nil && c.Err() != nil {
		b.lost[j] = true
	}
	if b.lost[j] {
		return nil
	}
	return m.InProgress()
}

// settled ends the heartbeats of fn(j)'s message, which is about to be
// settled.
func (b *batchBeat) settled(j int) {
	b.mu.Lock()
	b.lost[j] = true
	b.mu.Unlock()
}

func (b *batchBeat) running(j int, ctx context.Context) {
	b.mu.Lock()
	b.ctxs[j] = ctx
	b.mu.Unlock()
}

// ran marks fn(j) returned: its message still waits for the batch, and is
// kept alive unless its context ended while fn ran.
func (b *batchBeat) ran(j int, ctx context.Context) {
	b.mu.Lock()
	b.lost[j] = b.lost[j] || ctx.Err() != nil
	b.ctxs[j] = nil
	b.mu.Unlock()
}

func (b *batchBeat) stop() { close(b.done); <-b.exit }

// BatchConfig configures [ConsumeBatch].
type BatchConfig struct {
	// Size is the most messages in one batch. Default 16
	// (consume.DefaultBatchSize, as for every idem consumer).
	Size int
	// Wait bounds how long a batch waits for more: a batch is what the
	// pull has delivered, up to Size, at once; when that is fewer, also
	// what it delivers within Wait after the batch's first message.
	// Default 2ms (consume.DefaultBatchWait).
	Wait time.Duration
	// Batches is how many batches run at once, each in a goroutine of its
	// own, while the next is formed. Default 2 (consume.DefaultBatches).
	Batches int
	// Ahead is the most messages the pull keeps delivered to this client
	// ahead of the batches, besides the Size that the batch being formed
	// holds (jetstream.PullMaxMessages): the larger, the fewer pull
	// requests per message. Such a message is not kept
	// alive by msg.InProgress until its batch runs, so the consumer's
	// AckWait must outlast the time it waits: behind up to Ahead + Size ×
	// (Batches + 1) others, that is about Ahead / (Size × Batches) + 2
	// batch durations. Default 4 × Size × Batches (128 with the other
	// defaults, so about 6 batch durations); lower it when a batch can
	// take longer than a sixth of AckWait.
	Ahead int
}

func (c *BatchConfig) withDefaults() (BatchConfig, error) {
	var out BatchConfig
	if c != nil {
		out = *c
	}
	b := consume.Batching{Size: out.Size, Wait: out.Wait, Batches: out.Batches}.WithDefaults()
	out.Size, out.Wait, out.Batches = b.Size, b.Wait, b.Batches
	if out.Size < 0 || out.Wait < 0 || out.Batches < 0 || out.Ahead < 0 {
		return out, fmt.Errorf("%w: BatchConfig Size %d, Wait %v, Batches %d and Ahead %d must be positive (defaults %d, %v, %d, 4 × Size × Batches)", ErrInvalidConfig, out.Size, out.Wait, out.Batches, out.Ahead, consume.DefaultBatchSize, consume.DefaultBatchWait, consume.DefaultBatches)
	}
	if out.Ahead == 0 {
		out.Ahead = 4 * out.Size * out.Batches
	}
	return out, nil
}

// ConsumeBatch consumes c and hands its messages to p (made by
// [WrapBatch]) in batches of up to cfg.Size, cfg.Batches at once, until
// ctx is done. The messages come from one long-lived pull
// (jetstream.Consumer.Messages) that keeps up to cfg.Ahead of them
// delivered ahead of the batches, asking the server for more when half
// are taken; a batch is what that pull has delivered, up to Size, and,
// when that is fewer, what it delivers within cfg.Wait of the batch's
// first message (consume.Collect, the rule of every idem consumer that
// forms batches). Every batch runs on the same batch workers, held for
// as long as ConsumeBatch runs (its context carries it,
// [idem.WithBatchWorkers]), so the engine's batch workers outlive each
// batch. A message is kept from redelivery by msg.InProgress once its
// batch runs; see [BatchConfig].Ahead for the AckWait this asks for
// before.
//
// Batches in hand when ctx ends still run to the end and are settled
// (with ctx's values, without its cancellation); the pull is stopped at
// once, and a message it had delivered that no batch had taken yet is
// nakked, so the server redelivers it at once (if the Nak is lost, after
// the consumer's AckWait). It returns nil when ctx is done, and
// an error when the consumer cannot be read (deleted, connection
// closed), in both cases once the pull is stopped, every batch it
// started has been settled and its goroutines have ended.
func ConsumeBatch(ctx context.Context, c jetstream.Consumer, cfg *BatchConfig, p ProcessBatch) error {
	bc, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if c == nil || p == nil {
		return fmt.Errorf("%w: ConsumeBatch needs a consumer and a ProcessBatch", ErrInvalidConfig)
	}
	// The iterator, not Consume with a handler: the iterator watches for
	// the server's heartbeats only while it waits for a message, whereas
	// Consume's handler, held while every batch is busy, would miss them
	// and have Consume pull another Ahead messages each time.
	it, err := c.Messages(jetstream.PullMaxMessages(bc.Ahead), jetstream.PullHeartbeat(idleHeartbeat))
	if err != nil {
		return fmt.Errorf("idemnats: reading the consumer: %w", err)
	}
	run, stopWorkers := idem.WithBatchWorkers(context.WithoutCancel(ctx))
	defer stopWorkers()
	msgs := make(chan jetstream.Msg, bc.Size)
	var wg sync.WaitGroup
	for range bc.Batches {
		wg.Go(func() {
			for {
				b := consume.Collect(msgs, bc.Size, bc.Wait, store.SystemClock{})
				if len(b) == 0 {
					return
				}
				p(run, b)
			}
		})
	}
	err = feed(ctx, c, it, msgs)
	stop(it) // no more messages to this client while the batches in hand finish
	close(msgs)
	wg.Wait()
	return err
}

// feed passes the messages of it to msgs until ctx is done (nil) or c
// cannot be read (its error).
func feed(ctx context.Context, c jetstream.Consumer, it jetstream.MessagesContext, msgs chan<- jetstream.Msg) error {
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case err == nil:
			msgs <- m
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The server stopped confirming the idle pull: a consumer
			// deleted under it is not always told to it; otherwise the
			// pull asks again by itself.
			if err := exists(ctx, c); err != nil {
				return fmt.Errorf("idemnats: reading the consumer: %w", err)
			}
		default:
			return fmt.Errorf("idemnats: reading the consumer: %w", err)
		}
	}
}

// stop ends the pull: it unsubscribes and, once the server has seen it
// (jetstream's Drain), naks what the pull had delivered that no batch
// took, so that it is redelivered now rather than after AckWait. It
// gives up waiting for the server after drainWait.
func stop(it jetstream.MessagesContext) {
	it.Drain()
	for {
		m, err := it.Next(jetstream.NextMaxWait(drainWait))
		if err != nil {
			it.Stop()
			return
		}
		_ = m.Nak() // if it fails, AckWait redelivers it
	}
}

// drainWait bounds how long stop waits for the server to confirm the end
// of the pull.
const drainWait = 5 * time.Second

// idleHeartbeat is how often the server confirms the pull while it has
// no message for it; a pull that hears nothing for twice as long asks
// whether its consumer still exists.
const idleHeartbeat = time.Second

// exists returns c's error when the server no longer has c, and nil when
// it has it or cannot say (the pull keeps trying then).
func exists(ctx context.Context, c jetstream.Consumer) error {
	ctx, cancel := context.WithTimeout(ctx, idleHeartbeat)
	defer cancel()
	if _, err := c.Info(ctx); errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return nil
}
