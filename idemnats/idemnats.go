// Package idemnats makes a NATS JetStream message handler idempotent with
// an [idem.Engine], and acknowledges each message only after its outcome
// is recorded.
//
// # Acknowledgement follows the outcome
//
// The message's key (the Nats-Msg-Id header by default, or Config.Key)
// names the record; the payload is fingerprinted. Then:
//
//   - fn succeeded and the record is COMPLETED under this call's claim, or
//     an earlier success is replayed: Ack;
//   - fn returned a terminal error ([idem.Terminal]) and it is stored under
//     this call's claim, or a stored terminal error is replayed: Term, so
//     JetStream stops redelivering it;
//   - another worker holds the key: NakWithDelay until its lease ends;
//   - fn returned any other error (the engine released the claim), or the
//     store failed: Nak, so the message comes again;
//   - the outcome is uncertain ([idem.Uncertain]): nothing; the claim is
//     kept until its lease ends and JetStream redelivers after AckWait;
//   - the claim was taken over while fn ran (its context was cancelled with
//     [idem.ErrLeaseLost]) or the outcome write was refused: nothing. This
//     worker is a zombie; an ack from it would settle a delivery that the
//     new holder is still working on.
//
// Whether the outcome was recorded comes from the engine (Result.Recorded),
// which returns a successful value even when its Complete was refused.
//
// While fn runs, the engine renews the claim's lease and the wrapper calls
// msg.InProgress every Config.Heartbeat, so JetStream does not redeliver a
// long-running message to another consumer.
package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
)

// ErrInvalidConfig is returned by [Wrap] and [Handler] for an unusable
// [Config]; it wraps [idem.ErrInvalidConfig].
var ErrInvalidConfig = fmt.Errorf("idemnats: %w", idem.ErrInvalidConfig)

// HeaderMsgID is the header that names a message's key by default.
const HeaderMsgID = "Nats-Msg-Id"

// Config configures [Wrap] and [Handler].
type Config struct {
	// Operation is the idem operation name, the scope of the keys
	// (required).
	Operation string
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
// for Acked; the ack's own error when it failed). ctx must have no
// deadline, or the engine does not renew the lease.
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

// delivery is one message's pass through the engine.
type delivery struct {
	msg     jetstream.Msg
	ran     bool
	claim   idem.Claim
	claimed bool
	lost    bool // the operation's context ended with ErrLeaseLost
}

func (w *wrapper[T]) process(ctx context.Context, m jetstream.Msg) (Disposition, error) {
	key, err := w.cfg.Key(m)
	if err != nil {
		return w.settle(m, Termed, fmt.Errorf("idemnats: no key: %w", err))
	}
	req := idem.Request{Operation: w.cfg.Operation, Key: key, Payload: m.Data(), RawPayload: true}
	id, err := req.Identity()
	if err != nil {
		return w.settle(m, Termed, err)
	}
	d := &delivery{msg: m}
	res, err := idem.DoIdentity(ctx, w.e, id, func(ctx context.Context) (T, error) {
		d.ran = true
		d.claim, d.claimed = idem.FromContext(ctx)
		stop := w.heartbeat(ctx, m)
		v, ferr := w.fn(ctx, m)
		stop()
		d.lost = errors.Is(context.Cause(ctx), idem.ErrLeaseLost)
		return v, ferr
	})
	return w.decide(d, res.Replayed, res.Recorded, err)
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

// decide maps the engine's answer to the message's disposition.
func (w *wrapper[T]) decide(d *delivery, replayed bool, recorded idem.Status, err error) (Disposition, error) {
	m := d.msg
	var term *idem.TerminalError
	var inProg *idem.InProgressError
	switch {
	case d.lost:
		return w.settle(m, Left, fmt.Errorf("idemnats: claim taken over while the handler ran: %w", idem.ErrLeaseLost))
	case err == nil && (replayed || !d.ran):
		return w.settle(m, Acked, nil)
	case err == nil:
		if !d.claimed { // engine disabled or fail-open: nothing to check
			return w.settle(m, Acked, nil)
		}
		return w.settleRecorded(d, recorded, idem.StatusCompleted, Acked, nil)
	case errors.As(err, &term) && (term.Replayed || !d.ran):
		return w.settle(m, Termed, err)
	case errors.As(err, &term):
		if !d.claimed {
			return w.settle(m, Termed, err)
		}
		return w.settleRecorded(d, recorded, idem.StatusFailed, Termed, err)
	case errors.As(err, &inProg):
		return w.settleDelay(m, inProg.RetryAfter(w.e.Config().Clock.Now()), err)
	case errors.Is(err, idem.ErrUncertain):
		return w.settle(m, Left, err)
	case errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrInvalidKey):
		return w.settle(m, Termed, err)
	default:
		// A retryable error (the claim was released) or a store failure.
		return w.settle(m, Nakked, err)
	}
}

// settleRecorded acks or terms only when the engine recorded this
// delivery's outcome (Result.Recorded) as want; a refused or failed outcome
// write leaves the message, and the redelivery replays or runs again.
func (w *wrapper[T]) settleRecorded(d *delivery, recorded, want idem.Status, disp Disposition, opErr error) (Disposition, error) {
	switch {
	case recorded == idem.StatusFailed && want == idem.StatusCompleted:
		// A success whose result could not be stored (too large, not
		// encodable): the engine recorded a terminal marker instead.
		return w.settle(d.msg, Termed, fmt.Errorf("idemnats: result not stored: %w", idem.ErrResultTooLarge))
	case recorded != want:
		return w.settle(d.msg, Left, fmt.Errorf("idemnats: outcome not recorded under claim %d (taken over, or the store failed): %w",
			d.claim.Fence, idem.ErrLeaseLost))
	}
	return w.settle(d.msg, disp, opErr)
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
	if d != Acked {
		w.cfg.Logger.Info("idemnats: message not acked", "op", w.cfg.Operation, "subject", m.Subject(), "disposition", d.String(), "err", cause)
	}
	if err != nil {
		return d, errors.Join(cause, fmt.Errorf("idemnats: %s: %w", d, err))
	}
	return d, cause
}
