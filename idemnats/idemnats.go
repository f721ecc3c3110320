package idemnats

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
)

// ErrInvalidConfig is returned by [Wrap], [Handler], [WrapBatch] and
// [ConsumeBatch] for an unusable [Config] or [BatchConfig]; it wraps
// [idem.ErrInvalidConfig].
var ErrInvalidConfig = fmt.Errorf("idemnats: %w", idem.ErrInvalidConfig)

// HeaderMsgID is the header that names a message's key by default.
const HeaderMsgID = "Nats-Msg-Id"

// Config configures [Wrap], [Handler] and [WrapBatch].
type Config struct {
	// Operation is the idem operation name, the scope of the keys
	// (required).
	Operation string
	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its messages are terminated (consume.Decide: DeadLetter). Default false: the engine's policy.
	HoldCrashed bool
	// Key returns a message's idempotency key. Default: the Nats-Msg-Id
	// header; a message without one is terminated. The key must name the
	// logical message, the same on every publish of it: the server drops
	// a second publish with the same Nats-Msg-Id inside the stream's
	// duplicate window, so a producer that retries after that window (or
	// with a fresh id) needs a key of its own, from a header or the
	// payload.
	Key func(jetstream.Msg) (string, error)
	// AckWait is the consumer's AckWait (required). It must be at most
	// the engine's Lease, so that a redelivery never finds a lapsed claim
	// of a worker that is still alive.
	AckWait time.Duration
	// Heartbeat is how often msg.InProgress is sent while fn runs. It must
	// be shorter than AckWait. Default: the engine's RenewInterval, or
	// AckWait/3 when that is not shorter than AckWait.
	Heartbeat time.Duration
	// Logger logs what was done with a message that was not acked.
	// Default: the engine's Logger.
	Logger *slog.Logger
	// Concurrency is, for [WrapBatch], how many of a batch's handlers run
	// at once. Default 0: all of them; 1 runs them in order. Not used by
	// [Wrap].
	Concurrency int
}

// WithDefaults returns a copy of c with defaults filled in, for the engine
// e. A nil c is an empty Config.
func (c *Config) WithDefaults(e *idem.Engine) Config {
	var out Config
	if c != nil {
		out = *c
	}
	ec := e.Config()
	if out.Key == nil {
		out.Key = msgID
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = min(ec.RenewInterval, ec.Lease/3)
		if out.AckWait > 0 && out.Heartbeat >= out.AckWait {
			out.Heartbeat = out.AckWait / 3
		}
	}
	if out.Logger == nil {
		out.Logger = ec.Logger
	}
	return out
}

func (c *Config) validate(e *idem.Engine) error {
	lease := e.Config().Lease
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Operation == "":
		return bad("Operation is empty; name the operation, such as \"orders.ship\"")
	case c.AckWait <= 0:
		return bad("AckWait is %v; set it to the consumer's AckWait (jetstream.ConsumerConfig.AckWait, default 30s)", c.AckWait)
	case c.AckWait > lease:
		return bad("AckWait %v is longer than the engine's Lease %v; shorten AckWait or raise idem.Config.Lease", c.AckWait, lease)
	case c.Heartbeat <= 0:
		return bad("Heartbeat is %v; it must be positive", c.Heartbeat)
	case c.Concurrency < 0:
		return bad("Concurrency is %d; use 0 (a whole batch at once) or more", c.Concurrency)
	case c.Heartbeat >= c.AckWait:
		return bad("Heartbeat %v must be shorter than AckWait %v, or JetStream redelivers between heartbeats", c.Heartbeat, c.AckWait)
	}
	return nil
}

// ErrNoKey: the message has no Nats-Msg-Id header (default Config.Key).
var ErrNoKey = errors.New("idemnats: message has no " + HeaderMsgID + " header")

func msgID(m jetstream.Msg) (string, error) {
	if id := m.Headers().Get(HeaderMsgID); id != "" {
		return id, nil
	}
	return "", ErrNoKey
}

// Disposition is what the wrapper did with a message.
type Disposition int

// The dispositions.
const (
	// Left: neither acked nor nakked (uncertain outcome, or fenced out).
	Left Disposition = iota
	// Acked: the outcome is a recorded or replayed success.
	Acked
	// Termed: the outcome is a recorded or replayed terminal error, or the
	// message cannot be keyed or reuses a key with another payload.
	Termed
	// Nakked: a retryable error or a store failure; redelivered at once.
	Nakked
	// Delayed: another worker holds the key; nakked with a delay until its
	// lease ends.
	Delayed
)

var dispositionNames = [...]string{"left", "acked", "termed", "nakked", "delayed"}

func (d Disposition) String() string {
	if d < 0 || int(d) >= len(dispositionNames) {
		return "unknown"
	}
	return dispositionNames[d]
}

// Func is a message handler whose result is stored and replayed.
type Func[T any] func(ctx context.Context, msg jetstream.Msg) (T, error)

// Process handles one message; see [Wrap].
type Process func(ctx context.Context, msg jetstream.Msg) (Disposition, error)

// Wrap returns fn made idempotent: Process runs fn at most once per key
// (see the package documentation), acknowledges the message according to
// the outcome and returns what it did with the error that led there (nil
// for Acked, or consume.ErrOutcomeNotRecorded when the store failed after
// fn succeeded; the ack's own error when it failed). A deadline on ctx
// sets the claim's first lease; the engine renews the lease while fn runs,
// deadline or not.
func Wrap[T any](e *idem.Engine, cfg *Config, fn Func[T]) (Process, error) {
	if e == nil || fn == nil {
		return nil, fmt.Errorf("%w: engine and handler are required", ErrInvalidConfig)
	}
	c := cfg.WithDefaults(e)
	if err := c.validate(e); err != nil {
		return nil, err
	}
	w := &wrapper[T]{e: e, cfg: c, fn: fn}
	return w.process, nil
}

// Handler is [Wrap] for jetstream.Consumer.Consume: each message runs
// with context.Background().
func Handler[T any](e *idem.Engine, cfg *Config, fn Func[T]) (jetstream.MessageHandler, error) {
	p, err := Wrap(e, cfg, fn)
	if err != nil {
		return nil, err
	}
	return func(m jetstream.Msg) { p(context.Background(), m) }, nil
}

type wrapper[T any] struct {
	e   *idem.Engine
	cfg Config
	fn  Func[T]
}

func (w *wrapper[T]) process(ctx context.Context, m jetstream.Msg) (Disposition, error) {
	id, err := w.identity(m)
	if err != nil {
		return w.settleVerdict(m, consume.Decide(idem.Result[T]{}, err, w.e.Now()))
	}
	res, err := idem.DoIdentity(ctx, w.e, id, func(ctx context.Context) (T, error) {
		stop := w.heartbeat(ctx, m)
		defer stop()
		return w.fn(ctx, m)
	})
	return w.settleVerdict(m, consume.Decide(res, err, w.e.Now()))
}

// identity is m's key (clientkey.KeyIdentity of the operation and the
// message's key, as idemctl find and the console derive it; or, when
// Config.Key found none, clientkey.PayloadIdentity of the data) and
// fingerprint (the message data's digest); an error means m cannot be keyed, and
// consume.Decide settles it (DeadLetter: terminated).
func (w *wrapper[T]) identity(m jetstream.Msg) (idem.Identity, error) {
	id, err := w.keyed(m)
	id.HoldCrashed = w.cfg.HoldCrashed && err == nil
	return id, err
}

func (w *wrapper[T]) keyed(m jetstream.Msg) (idem.Identity, error) {
	key, err := w.cfg.Key(m)
	if err != nil {
		return idem.Identity{}, consume.NoKey(fmt.Errorf("idemnats: no key: %w", err))
	}
	data := m.Data()
	if key == "" {
		// Config.Key found none: the data is the key, unscoped.
		return clientkey.PayloadIdentity(w.cfg.Operation, "", data)
	}
	if data == nil {
		return clientkey.KeyIdentity(w.cfg.Operation, "", key, nil)
	}
	fp := sha256.Sum256(data)
	return clientkey.KeyIdentity(w.cfg.Operation, "", key, &fp)
}

// settleVerdict carries out m's verdict: the one mapping of consume's
// actions to JetStream's, for a message alone or in a batch.
func (w *wrapper[T]) settleVerdict(m jetstream.Msg, v consume.Verdict) (Disposition, error) {
	switch v.Action {
	case consume.Done:
		return w.settle(m, Acked, v.Err)
	case consume.DeadLetter:
		return w.settle(m, Termed, v.Err)
	case consume.RetryAfter:
		return w.settleDelay(m, v.Delay, v.Err)
	case consume.Retry:
		return w.settle(m, Nakked, v.Err)
	}
	return w.settle(m, Left, v.Err)
}

// heartbeat sends msg.InProgress every Heartbeat until stop or ctx ends.
func (w *wrapper[T]) heartbeat(ctx context.Context, m jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(w.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return // the claim is lost or the caller gave up: let AckWait run out
			case <-t.C:
				if err := m.InProgress(); err != nil {
					w.cfg.Logger.Warn("idemnats: InProgress failed", "op", w.cfg.Operation, "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-exited }
}

func (w *wrapper[T]) settleDelay(m jetstream.Msg, delay time.Duration, cause error) (Disposition, error) {
	if err := m.NakWithDelay(delay); err != nil {
		return Delayed, errors.Join(cause, fmt.Errorf("idemnats: nak: %w", err))
	}
	return Delayed, cause
}

func (w *wrapper[T]) settle(m jetstream.Msg, d Disposition, cause error) (Disposition, error) {
	var err error
	switch d {
	case Acked:
		err = m.Ack()
	case Termed:
		err = m.Term()
	case Nakked:
		err = m.Nak()
	}
	if d != Acked || cause != nil {
		w.cfg.Logger.Info("idemnats: message settled", "op", w.cfg.Operation, "subject", m.Subject(), "disposition", d.String(), "err", cause)
	}
	if err != nil {
		return d, errors.Join(cause, fmt.Errorf("idemnats: %s: %w", d, err))
	}
	return d, cause
}
