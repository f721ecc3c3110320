package idemamqp

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
)

// DefaultConsumerTimeout is RabbitMQ's default consumer_timeout: a delivery
// left unacknowledged longer than this closes its channel.
const DefaultConsumerTimeout = 30 * time.Minute

// Config configures a [Consumer]. Every field documents its default.
type Config struct {
	// Operation is the idem operation name, the scope of the keys
	// (required), such as "ship-order". Two consumers with the same
	// Operation share keys.
	Operation string

	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its deliveries are rejected without requeue
	// (consume.Decide: DeadLetter). Default false: the engine's policy.
	HoldCrashed bool

	// Key returns the idempotency key of a message from its body, to catch
	// a producer that published the same thing twice under two message
	// ids. Default: the delivery's MessageId; a delivery without one is
	// rejected. The redelivered flag is never used.
	Key func(body []byte) (string, error)

	// ConsumerTimeout is the broker's consumer_timeout (rabbitmq.conf, or
	// the queue's x-consumer-timeout argument). The engine's Lease and
	// Wait, and Backoff, must each be shorter, or the broker closes the
	// channel under a handler that still holds its key. Default
	// [DefaultConsumerTimeout] (30m).
	ConsumerTimeout time.Duration

	// Delay, when set, is where messages go to be tried again later (in
	// progress elsewhere, a retryable error, an uncertain outcome): the
	// message is published to the delay queue, confirmed by the broker,
	// and only then acknowledged; the delay queue dead-letters it back to
	// the work queue after its TTL. See [DeclareDelay]. Default nil: the
	// handler holds the message for Backoff and then requeues it.
	Delay *Delay

	// Backoff is how long a message is held before it is requeued when
	// there is no Delay queue (and the fallback when publishing to the
	// delay queue fails), so that a message that cannot run yet is not
	// redelivered in a hot loop. Default 1s.
	Backoff time.Duration

	// Settled, when set, is called after every delivery is settled, from
	// the goroutine that handled it. For metrics and tests.
	Settled func(amqp.Delivery, Settlement)

	// Logger receives a line for every delivery not acknowledged. Default:
	// the engine's logger.
	Logger *slog.Logger
}

// Action is what a [Consumer] did with a delivery.
type Action int

const (
	// Acked: the handler succeeded, now or earlier (a replay).
	Acked Action = iota + 1
	// Rejected: rejected without requeue, so the broker dead-letters it when
	// the queue has a dead-letter exchange and drops it otherwise: a
	// terminal error (returned now or replayed), a key reused with another
	// body, a message without a key.
	Rejected
	// Delayed: published to the delay queue (confirmed) and acknowledged.
	Delayed
	// Requeued: negatively acknowledged with requeue, after Backoff (none
	// when the consumer is shutting down).
	Requeued
)

func (a Action) String() string {
	switch a {
	case Acked:
		return "acked"
	case Rejected:
		return "rejected"
	case Delayed:
		return "delayed"
	case Requeued:
		return "requeued"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Settlement is the outcome of one delivery.
type Settlement struct {
	Action Action
	// Replayed is true when an Ack or Reject came from an earlier
	// execution: the handler did not run.
	Replayed bool
	// Verdict is the verdict the delivery was settled by (consume.Decide),
	// zero only for a delivery not from a channel (no Acknowledger). A
	// delivery without a usable key has Decide's verdict for
	// consume.NoKey's error: DeadLetter.
	Verdict consume.Verdict
	// Err is why the delivery was not acknowledged (the handler's or the
	// engine's error), or that its outcome could not be recorded, joined
	// with any error settling it.
	Err error
}

// Consumer runs a delivery handler at most once per key and settles every
// delivery (see [Consumer.Handle]). It is safe for concurrent use.
type Consumer struct {
	eng *idem.Engine
	cfg Config
	fn  func(context.Context, amqp.Delivery) error
	log *slog.Logger
}

// New wraps fn. It fails with [idem.ErrInvalidConfig] when the engine's
// Lease or Wait, or Backoff, is not shorter than cfg.ConsumerTimeout.
func New(eng *idem.Engine, cfg *Config, fn func(context.Context, amqp.Delivery) error) (*Consumer, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: idemamqp: "+format, append([]any{idem.ErrInvalidConfig}, args...)...)
	}
	if eng == nil || fn == nil || cfg == nil {
		return nil, bad("engine, config and handler are required")
	}
	c := *cfg
	if c.Operation == "" {
		return nil, bad("Config.Operation (the operation name, the scope of the keys) is required")
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	ec := eng.Config()
	switch {
	case c.ConsumerTimeout < 0 || c.Backoff < 0:
		return nil, bad("ConsumerTimeout %v and Backoff %v must be positive", c.ConsumerTimeout, c.Backoff)
	case ec.Lease >= c.ConsumerTimeout:
		return nil, bad("the engine's Lease %v is not shorter than the broker's consumer timeout %v: the broker would close the channel and redeliver while the key is still held; shorten idem.Config.Lease (it is renewed while the handler runs) or raise consumer_timeout and Config.ConsumerTimeout", ec.Lease, c.ConsumerTimeout)
	case ec.Wait >= c.ConsumerTimeout:
		return nil, bad("the engine's Wait %v is not shorter than the broker's consumer timeout %v; shorten idem.Config.Wait", ec.Wait, c.ConsumerTimeout)
	case c.Backoff >= c.ConsumerTimeout:
		return nil, bad("Backoff %v is not shorter than the broker's consumer timeout %v", c.Backoff, c.ConsumerTimeout)
	}
	log := c.Logger
	if log == nil {
		log = ec.Logger
	}
	return &Consumer{eng: eng, cfg: c, fn: fn, log: log}, nil
}

// Handle runs fn for d under its key, unless it ran already, and settles d
// by the verdict of [consume.Decide], the one rule of every idem consumer
// (its package doc has the table and the reasons):
//
//   - consume.Done → Ack;
//   - consume.DeadLetter (a terminal error now or replayed, the key reused
//     with another body) → Reject without requeue (to the queue's
//     dead-letter exchange, if any); later copies are rejected too, without
//     running fn;
//   - consume.RetryAfter (the key held by another consumer, after the
//     engine's Config.Wait), consume.Retry (fn returned another error, the
//     store failed) and consume.Leave (an uncertain outcome
//     ([idem.Uncertain]), or a key taken over while fn ran) → tried later:
//     to the Delay queue when there is one, else held for Backoff and
//     requeued. Leave cannot be left to the broker here: an unacknowledged
//     delivery holds a prefetch slot and comes back only when the channel
//     closes. An uncertain outcome keeps its claim until the lease ends, so
//     the copies that come back before then are delayed again, and the
//     first after it runs fn again (as after a crash);
//   - the message has no key → Reject;
//   - ctx is done → Requeue at once.
//
// Never is a delivery acknowledged before fn succeeded.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) Settlement {
	return c.report(d, c.handle(ctx, d))
}

// report logs a delivery not acknowledged and calls Config.Settled.
func (c *Consumer) report(d amqp.Delivery, s Settlement) Settlement {
	if s.Action != Acked {
		c.log.Info("idemamqp: delivery not acknowledged", "operation", c.cfg.Operation, "message_id", d.MessageId, "action", s.Action.String(), "err", s.Err)
	}
	if c.cfg.Settled != nil {
		c.cfg.Settled(d, s)
	}
	return s
}

func (c *Consumer) handle(ctx context.Context, d amqp.Delivery) Settlement {
	id, s, ok := c.identity(ctx, d)
	if !ok {
		return s
	}
	res, err := idem.DoIdentity(ctx, c.eng, id, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.fn(ctx, d)
	})
	return c.decided(ctx, d, res, err)
}

var errNoKey = errors.New("idemamqp: message has no key: publish it with a MessageId, or set Config.Key")

// identity is d's key (clientkey.KeyIdentity of the operation and the message's
// key, as idemctl find and the console derive it) and fingerprint (the
// body's digest); when ok is false, d could not be keyed and s says how it
// was settled (by consume.Decide's verdict, unless d is not from a
// channel).
func (c *Consumer) identity(ctx context.Context, d amqp.Delivery) (id idem.Identity, s Settlement, ok bool) {
	if d.Acknowledger == nil {
		return id, Settlement{Action: Rejected, Err: errors.New("idemamqp: delivery has no acknowledger (not from a channel)")}, false
	}
	key := d.MessageId
	if c.cfg.Key != nil {
		var err error
		if key, err = c.cfg.Key(d.Body); err != nil {
			return id, c.decided(ctx, d, idem.Result[struct{}]{}, consume.NoKey(fmt.Errorf("idemamqp: Config.Key: %w", err))), false
		}
	}
	if key == "" {
		return id, c.decided(ctx, d, idem.Result[struct{}]{}, consume.NoKey(errNoKey)), false
	}
	fp := sha256.Sum256(d.Body)
	id, err := clientkey.KeyIdentity(c.cfg.Operation, "", key, &fp)
	if err != nil {
		return id, c.decided(ctx, d, idem.Result[struct{}]{}, err), false
	}
	id.HoldCrashed = c.cfg.HoldCrashed
	return id, Settlement{}, true
}

// decided settles d by the verdict of the engine's answer for it: the one
// mapping of consume's actions to AMQP's, for a delivery alone or in a
// batch.
func (c *Consumer) decided(ctx context.Context, d amqp.Delivery, res idem.Result[struct{}], err error) Settlement {
	v := consume.Decide(res, err, c.eng.Now())
	replayed := res.Replayed
	var te *idem.TerminalError
	if errors.As(err, &te) {
		replayed = te.Replayed
	}
	switch v.Action {
	case consume.Done:
		return settle(Settlement{Action: Acked, Replayed: replayed, Verdict: v, Err: v.Err}, d.Ack(false))
	case consume.DeadLetter:
		return settle(Settlement{Action: Rejected, Replayed: replayed, Verdict: v, Err: v.Err}, d.Reject(false))
	}
	s := c.later(ctx, d, v.Err)
	s.Verdict = v
	return s
}

// later settles d to be tried again.
func (c *Consumer) later(ctx context.Context, d amqp.Delivery, cause error) Settlement {
	if ctx.Err() != nil {
		return settle(Settlement{Action: Requeued, Err: cause}, d.Nack(false, true))
	}
	if c.cfg.Delay != nil {
		perr := c.cfg.Delay.publish(ctx, d)
		if perr == nil {
			return settle(Settlement{Action: Delayed, Err: cause}, d.Ack(false))
		}
		cause = errors.Join(cause, perr)
	}
	t := time.NewTimer(c.cfg.Backoff)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return settle(Settlement{Action: Requeued, Err: cause}, d.Nack(false, true))
}

func settle(s Settlement, err error) Settlement {
	if err != nil {
		s.Err = errors.Join(s.Err, fmt.Errorf("idemamqp: settling the delivery (%s): %w", s.Action, err))
	}
	return s
}

// ConsumeArgs are the arguments of [amqp.Channel.Consume] that [Consumer.Run]
// passes on.
type ConsumeArgs struct {
	// Queue to consume (required).
	Queue string
	// Consumer tag; default: one the broker makes up.
	Consumer string
	// AutoAck must be false: with automatic acknowledgement the broker
	// considers a message done once sent, before the handler ran, so a
	// consumer that crashes loses it. Run refuses it.
	AutoAck   bool
	Exclusive bool
	Args      amqp.Table
	// Concurrency is how many deliveries are handled at once; Run sets the
	// channel's prefetch count to it. Default 1.
	Concurrency int
}

// Run consumes a.Queue on ch with manual acknowledgement and hands every
// delivery to [Consumer.Handle], a.Concurrency at a time. It returns nil
// when ctx is done (after cancelling the consumer and letting the handlers
// in flight finish) and an error when the channel closes. Run sets ch's
// prefetch count (QoS) to a.Concurrency.
func (c *Consumer) Run(ctx context.Context, ch *amqp.Channel, a ConsumeArgs) error {
	n := max(a.Concurrency, 1)
	deliveries, stop, err := c.consume(ctx, ch, a, n)
	if err != nil {
		return err
	}
	defer stop()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for d := range deliveries {
				c.Handle(ctx, d)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("idemamqp: deliveries of %s stopped: %w", a.Queue, amqp.ErrClosed)
}

// consume checks a, sets ch's prefetch count and starts consuming a.Queue,
// until ctx is done (stop ends that watch).
func (c *Consumer) consume(ctx context.Context, ch *amqp.Channel, a ConsumeArgs, prefetch int) (deliveries <-chan amqp.Delivery, stop func() bool, err error) {
	if a.AutoAck {
		return nil, nil, fmt.Errorf("%w: idemamqp: auto-ack is refused: the broker would consider each message done before its handler ran, and a crash would lose it; consume with manual acknowledgement (AutoAck false)", idem.ErrInvalidConfig)
	}
	if a.Queue == "" {
		return nil, nil, fmt.Errorf("%w: idemamqp: ConsumeArgs.Queue is required", idem.ErrInvalidConfig)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, nil, fmt.Errorf("idemamqp: setting prefetch: %w", err)
	}
	tag := a.Consumer
	if tag == "" {
		tag = "idemamqp-" + c.cfg.Operation + "-" + fmt.Sprint(time.Now().UnixNano())
	}
	deliveries, err = ch.ConsumeWithContext(context.WithoutCancel(ctx), a.Queue, tag, false, a.Exclusive, false, false, a.Args)
	if err != nil {
		return nil, nil, fmt.Errorf("idemamqp: consuming %s: %w", a.Queue, err)
	}
	return deliveries, context.AfterFunc(ctx, func() { _ = ch.Cancel(tag, false) }), nil
}
