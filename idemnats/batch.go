package idemnats

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
)

// ProcessBatch handles a batch of messages; see [WrapBatch]. ds[i] and
// errs[i] say what was done with msgs[i], as [Process] says for one.
type ProcessBatch func(ctx context.Context, msgs []jetstream.Msg) (ds []Disposition, errs []error)

// WrapBatch is [Wrap] for a batch of messages, as fetched together: the
// keys of the batch are claimed together by [idem.DoBatch] (in one round
// trip on a store that claims in batches, as redisstore does), fn runs for
// each claimed message, Config.Concurrency at once, each under its own
// lease and with its own outcome write, and each message is then settled
// by its own verdict, exactly as Wrap settles it. A message without a key
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
	clock := w.e.Config().Clock
	for i, m := range msgs {
		id, err := w.identity(m)
		if err != nil {
			ds[i], errs[i] = w.settleVerdict(m, consume.Decide(idem.Result[T]{}, err, clock.Now()))
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
	idem.DoBatchWith(ctx, w.e, ids, idem.BatchOptions[T]{
		Concurrency: w.cfg.Concurrency,
		// Each message is settled as soon as its own outcome is recorded,
		// and gets no heartbeat after.
		Answered: func(j int, res idem.Result[T], err error) {
			i := at[j]
			hb.settled(j)
			ds[i], errs[i] = w.settleVerdict(msgs[i], consume.Decide(res, err, clock.Now()))
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
	// Wait bounds how long a batch waits for messages the server does
	// not have yet: a batch is what the server has, up to Size, at once;
	// when it had none, the first message to arrive and those that
	// arrive within Wait after it. Default 2ms (consume.DefaultBatchWait).
	Wait time.Duration
	// Batches is how many batches run at once, each in a goroutine of its
	// own, while the next is pulled. Default 2 (consume.DefaultBatches).
	Batches int
}

func (c *BatchConfig) withDefaults() (BatchConfig, error) {
	var out BatchConfig
	if c != nil {
		out = *c
	}
	b := consume.Batching{Size: out.Size, Wait: out.Wait, Batches: out.Batches}.WithDefaults()
	out.Size, out.Wait, out.Batches = b.Size, b.Wait, b.Batches
	if out.Size < 0 || out.Wait < 0 || out.Batches < 0 {
		return out, fmt.Errorf("%w: BatchConfig Size %d, Wait %v and Batches %d must be positive (defaults %d, %v, %d)", ErrInvalidConfig, out.Size, out.Wait, out.Batches, consume.DefaultBatchSize, consume.DefaultBatchWait, consume.DefaultBatches)
	}
	return out, nil
}

// ConsumeBatch pulls messages from c and hands them to p (made by
// [WrapBatch]) in batches of up to cfg.Size, cfg.Batches at once, until
// ctx is done. Each batch is one pull (jetstream.Consumer.FetchNoWait)
// of up to Size messages, which the server answers at once with what it
// has; when it had none, ConsumeBatch waits for a first message as long
// as ctx lasts, then cfg.Wait for more, and pulls what the server has
// then. The next batch is pulled while batches run. Every batch runs on one
// [idem.BatchRunner], held for as long as ConsumeBatch runs (its context
// carries it, [idem.WithBatchRunner]), so the engine's batch workers
// outlive each batch.
//
// Batches in hand when ctx ends still run to the end and are settled
// (with ctx's values, without its cancellation); a message the server
// sent to a pull that ctx's end cut short comes back after the
// consumer's AckWait. It returns nil when ctx is done, and the pull's
// error when the consumer cannot be read (deleted, connection closed),
// in both cases once every batch it started has been settled and its
// goroutines have ended.
func ConsumeBatch(ctx context.Context, c jetstream.Consumer, cfg *BatchConfig, p ProcessBatch) error {
	bc, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if c == nil || p == nil {
		return fmt.Errorf("%w: ConsumeBatch needs a consumer and a ProcessBatch", ErrInvalidConfig)
	}
	r := idem.NewBatchRunner()
	defer r.Close()
	run := idem.WithBatchRunner(context.WithoutCancel(ctx), r)
	batches := make(chan []jetstream.Msg)
	var wg sync.WaitGroup
	for range bc.Batches {
		wg.Go(func() {
			for b := range batches {
				p(run, b)
			}
		})
	}
	defer wg.Wait()
	defer close(batches)
	for {
		batch, err := pull(ctx, c, bc)
		if len(batch) > 0 {
			batches <- batch
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("idemnats: reading the consumer: %w", err)
		}
	}
}

// pull takes the next batch from c: what the server has, up to bc.Size
// (FetchNoWait); when it has none, it waits for a first message as long
// as ctx lasts, then bc.Wait for more to arrive, and takes what the
// server has then. A pull never waits on the server's side for a batch
// to fill (a pull request with an expiry that the server had only partly
// answered could stay open long past its expiry).
func pull(ctx context.Context, c jetstream.Consumer, bc BatchConfig) ([]jetstream.Msg, error) {
	batch, err := fetch(make([]jetstream.Msg, 0, bc.Size), func() (jetstream.MessageBatch, error) { return c.FetchNoWait(bc.Size) })
	for len(batch) == 0 && err == nil {
		batch, err = fetch(batch, func() (jetstream.MessageBatch, error) {
			return c.Fetch(1, jetstream.FetchContext(ctx), jetstream.FetchHeartbeat(idleHeartbeat))
		})
		if len(batch) == 0 || err != nil || bc.Size == 1 {
			continue
		}
		t := time.NewTimer(bc.Wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return batch, nil
		}
		batch, err = fetch(batch, func() (jetstream.MessageBatch, error) { return c.FetchNoWait(bc.Size - 1) })
	}
	return batch, err
}

// idleHeartbeat is how often the server confirms a pull that waits for a
// first message: a pull that hears nothing for twice as long ends with
// the client's error (a consumer deleted under it is not always told to
// its waiting pulls).
const idleHeartbeat = time.Second

// fetch appends to batch the messages of one pull.
func fetch(batch []jetstream.Msg, pull func() (jetstream.MessageBatch, error)) ([]jetstream.Msg, error) {
	mb, err := pull()
	if err != nil {
		return batch, err
	}
	for m := range mb.Messages() {
		batch = append(batch, m)
	}
	return batch, mb.Error()
}
