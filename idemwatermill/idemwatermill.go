package idemwatermill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
)

// ErrInvalidConfig is returned by [Middleware] and [AddHandler] for an
// unusable [Config]; it wraps [idem.ErrInvalidConfig].
var ErrInvalidConfig = fmt.Errorf("idemwatermill: %w", idem.ErrInvalidConfig)

// WatermillMetadataPrefix begins the names of the metadata fields that
// Watermill's Pub/Subs and components set on a message as they deliver it
// (watermill-amqp's "_watermill_amqp_redelivered" on a redelivery): they
// are left out of the fingerprint, so that a redelivery is the same
// message.
const WatermillMetadataPrefix = "_watermill_"

// ErrNoKey: the message has nothing to key it by: an empty payload (the
// default key), no field Config.MetadataKey names, or an empty UUID
// (Config.KeyFromUUID).
var ErrNoKey = errors.New("idemwatermill: the message has no key")

// Config configures [Middleware].
type Config struct {
	// Operation is the idem operation name, the scope of the keys
	// (required).
	Operation string
	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its messages are dead-lettered (consume.Decide). Default false: the engine's policy.
	HoldCrashed bool
	// Key returns a message's idempotency key, unscoped. Default (none of
	// Key, MetadataKey and KeyFromUUID set): the message's payload, as the
	// producer sent it, hashed and scoped to the topic the router
	// subscribed to (message.SubscribeTopicFromCtx), so a copy of the
	// message is a duplicate however it was published again (see the
	// package doc). A chosen key must name the logical message, the same
	// on every publish of it. Set at most one of Key, MetadataKey and
	// KeyFromUUID.
	Key func(*message.Message) (string, error)
	// MetadataKey names the metadata field that holds the key, unscoped.
	MetadataKey string
	// KeyFromUUID keys a message by its UUID, unscoped. Choose it only
	// where producers set the UUID from their own id: Watermill's
	// publishers give a message a new UUID on every publish unless the
	// producer sets it, so a producer's retry would not be a duplicate.
	KeyFromUUID bool
	// IgnoreMetadata are metadata fields left out of the fingerprint of
	// a message keyed by a chosen key (the payload and every other field
	// are in it; the default key's fingerprint is the payload's), for fields a
	// publisher or a middleware sets anew on every publish of the same
	// message. Watermill's own fields, whose names begin with
	// "_watermill_" (WatermillMetadataPrefix), are always left out: its
	// Pub/Subs and components set them per delivery (watermill-amqp's
	// redelivered flag, the requeuer's retry count).
	IgnoreMetadata []string
	// MaxDelay bounds how long the middleware waits before it returns the
	// error of a message whose key another consumer holds (the verdict's
	// Delay, the other holder's lease), so that the nack does not bring
	// it back at once. Default 5s; negative: no wait.
	MaxDelay time.Duration
	// Logger logs messages that were not done. Default: the engine's.
	Logger *slog.Logger
	// Settled, when set, is called with every message and the verdict it
	// was settled by. For metrics and tests.
	Settled func(*message.Message, consume.Verdict)
}

// WithDefaults returns a copy of c with defaults filled in, for the engine
// e. A nil c is an empty Config.
func (c *Config) WithDefaults(e *idem.Engine) Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.MaxDelay == 0 {
		out.MaxDelay = 5 * time.Second
	}
	if out.Logger == nil {
		out.Logger = e.Config().Logger
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Operation == "":
		return fmt.Errorf("%w: Operation is empty; name the operation, such as \"orders.ship\"", ErrInvalidConfig)
	case (c.Key != nil) && (c.MetadataKey != "" || c.KeyFromUUID) || c.MetadataKey != "" && c.KeyFromUUID:
		return fmt.Errorf("%w: more than one of Key, MetadataKey and KeyFromUUID is set; set one, or none to key messages by their payload", ErrInvalidConfig)
	}
	return nil
}

// VerdictError is the error the middleware returns for a message that is
// not done: the router nacks it. Its Verdict says why and what should
// follow; Unwrap gives the handler's or the engine's error.
type VerdictError struct {
	Verdict consume.Verdict
}

func (e *VerdictError) Error() string {
	return fmt.Sprintf("idemwatermill: %s: %v", e.Verdict.Action, e.Verdict.Err)
}

func (e *VerdictError) Unwrap() error { return e.Verdict.Err }

// IsDeadLetter reports whether err is a message's that can never succeed
// (consume.DeadLetter): give it to middleware.PoisonQueueWithFilter so
// that only those go to the poison queue, and return !IsDeadLetter from
// middleware.Retry's ShouldRetry so that they are not retried.
func IsDeadLetter(err error) bool {
	var v *VerdictError
	return errors.As(err, &v) && v.Verdict.Action == consume.DeadLetter
}

// Middleware returns a router middleware that runs each message's handler
// through the engine e, at most once per key: a message whose outcome is
// recorded replays the messages its handler produced, without running it.
// See the package doc for the verdicts and how they compose with the
// router's Retry and PoisonQueue middlewares.
func Middleware(e *idem.Engine, cfg *Config) (message.HandlerMiddleware, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: an engine is required", ErrInvalidConfig)
	}
	c := cfg.WithDefaults(e)
	if err := c.validate(); err != nil {
		return nil, err
	}
	m := &middleware{e: e, cfg: c}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { return m.handle(h, msg) }
	}, nil
}

// AddHandler adds a handler to r as r.AddHandler does, run through
// [Middleware] (inside the router's own middlewares).
func AddHandler(r *message.Router, e *idem.Engine, cfg *Config, name, subscribeTopic string, sub message.Subscriber, publishTopic string, pub message.Publisher, h message.HandlerFunc) (*message.Handler, error) {
	mw, err := Middleware(e, cfg)
	if err != nil {
		return nil, err
	}
	handler := r.AddHandler(name, subscribeTopic, sub, publishTopic, pub, h)
	handler.AddMiddleware(mw)
	return handler, nil
}

// AddConsumerHandler is [AddHandler] for a handler that publishes nothing.
func AddConsumerHandler(r *message.Router, e *idem.Engine, cfg *Config, name, subscribeTopic string, sub message.Subscriber, h message.NoPublishHandlerFunc) (*message.Handler, error) {
	mw, err := Middleware(e, cfg)
	if err != nil {
		return nil, err
	}
	handler := r.AddConsumerHandler(name, subscribeTopic, sub, h)
	handler.AddMiddleware(mw)
	return handler, nil
}

type middleware struct {
	e   *idem.Engine
	cfg Config
}

// produced is a message a handler produced, as stored and replayed.
type produced struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

func (m *middleware) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	v, out := m.run(h, msg)
	if m.cfg.Settled != nil {
		m.cfg.Settled(msg, v)
	}
	if v.Action == consume.Done {
		if v.Err != nil {
			m.cfg.Logger.Warn("idemwatermill: message done, its outcome not recorded", "op", m.cfg.Operation, "uuid", msg.UUID, "err", v.Err)
		}
		return out, nil
	}
	m.cfg.Logger.Info("idemwatermill: message not done", "op", m.cfg.Operation, "uuid", msg.UUID, "verdict", v.Action.String(), "err", v.Err)
	if v.Action == consume.RetryAfter && m.cfg.MaxDelay > 0 {
		t := time.NewTimer(min(v.Delay, m.cfg.MaxDelay))
		select {
		case <-t.C:
		case <-msg.Context().Done():
			t.Stop()
		}
	}
	return nil, &VerdictError{Verdict: v}
}

func (m *middleware) run(h message.HandlerFunc, msg *message.Message) (consume.Verdict, []*message.Message) {
	id, err := m.identity(msg)
	if err != nil {
		// No usable key: consume.Decide's verdict, as for every consumer.
		return consume.Decide(idem.Result[[]produced]{}, consume.NoKey(err), m.e.Now()), nil
	}
	// The lease is renewed while the handler runs, whatever deadline the
	// message's context has.
	ctx := context.WithoutCancel(msg.Context())
	res, err := idem.DoIdentity(ctx, m.e, id, func(ctx context.Context) ([]produced, error) {
		prev := msg.Context()
		msg.SetContext(ctx)
		defer msg.SetContext(prev)
		outs, err := h(msg)
		if err != nil {
			return nil, err
		}
		ps := make([]produced, len(outs))
		for i, o := range outs {
			ps[i] = produced{UUID: o.UUID, Metadata: o.Metadata, Payload: o.Payload}
		}
		return ps, nil
	})
	v := consume.Decide(res, err, m.e.Now())
	if v.Action != consume.Done {
		return v, nil
	}
	outs := make([]*message.Message, len(res.Value))
	for i, p := range res.Value {
		o := message.NewMessage(p.UUID, p.Payload)
		for k, val := range p.Metadata {
			o.Metadata.Set(k, val)
		}
		outs[i] = o
	}
	return v, outs
}

// identity is msg's key and fingerprint, from package clientkey (which
// idemctl find and the console derive keys with): by default its
// payload's digest under the router's topic (clientkey.PayloadIdentity);
// with a key chosen, that key and the fingerprint of its payload and
// metadata (clientkey.KeyIdentity).
func (m *middleware) identity(msg *message.Message) (idem.Identity, error) {
	id, err := m.keyed(msg)
	id.HoldCrashed = m.cfg.HoldCrashed && err == nil
	return id, err
}

func (m *middleware) keyed(msg *message.Message) (idem.Identity, error) {
	var key string
	switch {
	case m.cfg.Key != nil:
		k, err := m.cfg.Key(msg)
		if err != nil {
			return idem.Identity{}, fmt.Errorf("idemwatermill: no key: %w", err)
		}
		key = k
	case m.cfg.MetadataKey != "":
		key = msg.Metadata.Get(m.cfg.MetadataKey)
	case m.cfg.KeyFromUUID:
		key = msg.UUID
	default:
		if len(msg.Payload) == 0 {
			return idem.Identity{}, ErrNoKey
		}
		return clientkey.PayloadIdentity(m.cfg.Operation, message.SubscribeTopicFromCtx(msg.Context()), msg.Payload)
	}
	if key == "" {
		return idem.Identity{}, ErrNoKey
	}
	fp := m.fingerprint(msg)
	return clientkey.KeyIdentity(m.cfg.Operation, "", key, &fp)
}

// fingerprint is the SHA-256 of msg's payload and its metadata (sorted,
// less IgnoreMetadata and Watermill's own fields), each length-prefixed.
func (m *middleware) fingerprint(msg *message.Message) (sum [sha256.Size]byte) {
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		if !strings.HasPrefix(k, WatermillMetadataPrefix) && !slices.Contains(m.cfg.IgnoreMetadata, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field(msg.Payload)
	for _, k := range keys {
		field([]byte(k))
		field([]byte(msg.Metadata[k]))
	}
	h.Sum(sum[:0])
	return sum
}
