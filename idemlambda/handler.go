package idemlambda

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

// Config is what every adapter shares. A nil *Config means all defaults.
type Config struct {
	// Operation is the operation name the keys are stored under. Default: the
	// function's name (AWS_LAMBDA_FUNCTION_NAME) and the handler's name,
	// "orders-fn.create"; the handler's name alone outside Lambda.
	Operation string

	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; see docs/lambda.md for what a timeout does under it.
	// The record adapters settle its messages as consume.Decide says
	// (DeadLetter). Default false: the engine's policy.
	HoldCrashed bool

	// KeyJMESPath selects the idempotency key from the event, as
	// Powertools' event_key_jmespath: "body", "powertools_json(body).[user, order_id]",
	// "detail.orderId". The selected value is hashed (canonical JSON, as
	// idem.Canonicalize makes it). The Powertools functions
	// powertools_json, powertools_base64 and powertools_base64_gzip are
	// available. Each adapter documents its default.
	//
	// Numbers are read exactly: 9007199254740993 and 1E700 are keys of
	// their own, not rounded to a float64 or refused. A number a float64
	// holds exactly is a number to JMESPath as usual; any other is not
	// (comparing it gives null, numeric functions refuse it), but it can
	// still be selected.
	KeyJMESPath string

	// ValidationJMESPath selects the part of the event that must be the
	// same on every call with a key, as Powertools'
	// payload_validation_jmespath; a call with the key and another value
	// fails with idem.ErrMismatch. Default: no validation.
	ValidationJMESPath string

	// RaiseOnMissingKey fails a call whose key selects nothing with
	// ErrMissingKey. By default such a call runs unprotected and a warning
	// is logged (as Powertools does).
	RaiseOnMissingKey bool

	// Logger receives the missing-key warnings. Default slog.Default().
	Logger *slog.Logger
}

// ErrMissingKey: KeyJMESPath selected nothing and RaiseOnMissingKey is set.
// The error is a [*MissingKeyError].
var ErrMissingKey = errors.New("idemlambda: no idempotency key in the event")

// MissingKeyError names the expression that selected nothing.
type MissingKeyError struct{ Expr string }

func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("idemlambda: KeyJMESPath %q selected no idempotency key from the event", e.Expr)
}

// Is makes errors.Is(err, ErrMissingKey) true.
func (e *MissingKeyError) Is(target error) bool { return target == ErrMissingKey }

// keyer turns an event into an idem identity.
type keyer struct {
	operation  string
	hold       bool
	key        *expr
	validation *expr
	raise      bool
	log        *slog.Logger
}

// newKeyer checks cfg for an adapter named name whose default key
// expression is defaultKey ("" = the whole event).
func newKeyer(name string, cfg *Config, defaultKey string) (*keyer, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Operation, err = operationFor(name, c.Operation); err != nil {
		return nil, err
	}
	if c.KeyJMESPath == "" {
		c.KeyJMESPath = defaultKey
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	k := &keyer{operation: c.Operation, hold: c.HoldCrashed, raise: c.RaiseOnMissingKey, log: c.Logger}
	if k.key, err = compile("KeyJMESPath", c.KeyJMESPath); err != nil {
		return nil, err
	}
	if k.validation, err = compile("ValidationJMESPath", c.ValidationJMESPath); err != nil {
		return nil, err
	}
	return k, nil
}

// operationFor returns op, or by default the function's name (when running
// in Lambda) and the handler's name; it fails when that is no valid
// operation name.
func operationFor(name, op string) (string, error) {
	if op == "" {
		op = name
		if fn := lambdacontext.FunctionName; fn != "" {
			op = fn + "." + name
		}
	}
	if _, err := idem.NewStoreKey(op, "", nil); err != nil {
		return "", fmt.Errorf("%w: idemlambda: Operation: %v", idem.ErrInvalidConfig, err)
	}
	return op, nil
}

// identity derives the identity of a decoded event. ok is false when the
// event has no key and the call is to run unprotected.
func (k *keyer) identity(event any) (id idem.Identity, ok bool, err error) {
	sel := event
	if k.key != nil {
		if sel, err = k.key.search(event); err != nil {
			return idem.Identity{}, false, err
		}
	}
	if missing(sel) {
		src := "(whole event)"
		if k.key != nil {
			src = k.key.src
		}
		if k.raise {
			return idem.Identity{}, false, &MissingKeyError{Expr: src}
		}
		k.log.Warn("idemlambda: no idempotency key in the event; running unprotected", "operation", k.operation, "key_jmespath", src)
		return idem.Identity{}, false, nil
	}
	b, err := json.Marshal(sel)
	if err != nil {
		return idem.Identity{}, false, fmt.Errorf("idemlambda: selected value cannot be encoded: %w", err)
	}
	fp, err := k.fingerprint(event)
	if err != nil {
		return idem.Identity{}, false, err
	}
	if id, err = clientkey.JSONIdentity(k.operation, "", b, fp); err != nil {
		return idem.Identity{}, false, fmt.Errorf("idemlambda: selected value: %w", err)
	}
	id.HoldCrashed = k.hold
	return id, true, nil
}

// fingerprint is the digest of what ValidationJMESPath selects from event,
// canonical, or nil without one. The identity comes from clientkey (JSONIdentity
// for a KeyJMESPath selection, KeyIdentity for FuncConfig.Key), which
// idemctl find and the console use too.
func (k *keyer) fingerprint(event any) (*[sha256.Size]byte, error) {
	if k.validation == nil {
		return nil, nil
	}
	v, err := k.validation.search(event)
	if err != nil {
		return nil, err
	}
	c, err := canonical(v)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(c)
	return &sum, nil
}

// canonical is v as canonical JSON, so that key order and spacing do not
// change a key. A value the root package refuses to canonicalise (a number
// with an exponent of a billion, nesting deeper than canonical.MaxDepth)
// fails with an error that is idem.ErrInvalidPayload.
func canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idemlambda: selected value cannot be encoded: %w", err)
	}
	c, err := idem.Canonicalize(b)
	if err != nil {
		return nil, fmt.Errorf("idemlambda: selected value: %w", err)
	}
	return c, nil
}

// FuncConfig configures [Wrap].
type FuncConfig[In, Out any] struct {
	Config
	// Key returns the idempotency key from the decoded input; "" means no
	// key (see RaiseOnMissingKey). It takes precedence over KeyJMESPath.
	// Without Key and KeyJMESPath the whole event is the key, as in
	// Powertools.
	Key func(ctx context.Context, in In) (string, error)
	// OnReplay, when set, sees every replayed result and returns what the
	// caller gets (Powertools' response_hook), e.g. to mark it replayed.
	OnReplay func(ctx context.Context, out Out) Out
}

// Wrap makes fn idempotent. The returned function has the shape
// aws-lambda-go's lambda.StartHandlerFunc takes; it decodes the event into
// In itself, so that KeyJMESPath and ValidationJMESPath see the raw event.
// The lease is the invocation's deadline: a retry after a timed-out
// invocation takes over once the deadline has passed. A duplicate while the
// first runs fails with *idem.InProgressError; the result (or a terminal
// error) of the first is replayed to every later one.
//
// # Handing work off
//
// A handler that starts work finishing after its invocation (a Step
// Functions execution, a queued job) hands its claim to that work with
// idem.Detach(ctx, expectedCompletion, ref), ctx being the context fn
// was given. The claim then outlives the invocation: its lease becomes
// now + expectedCompletion instead of the invocation's deadline, so no
// retry takes the key over when the invocation ends, and the engine records
// nothing when fn returns (not its result, not its error, nor a panic's
// release). A duplicate meanwhile fails with an *idem.InProgressError whose
// Ref is ref. The work finishes the key with the token Detach returned,
// from any process with an engine on the store: eng.Complete(ctx, tok, out)
// with the Out later invocations get, or eng.Fail; eng.Extend is its
// heartbeat. WrapRaw and the SQS and EventBridge handlers hand off the same
// way; the HTTP adapters answer 202 instead (HTTPConfig.StatusPath).
func Wrap[In, Out any](eng *idem.Engine, name string, fn func(context.Context, In) (Out, error), cfg *FuncConfig[In, Out]) (func(context.Context, json.RawMessage) (Out, error), error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	var c FuncConfig[In, Out]
	if cfg != nil {
		c = *cfg
	}
	k, err := newKeyer(name, &c.Config, "")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, raw json.RawMessage) (Out, error) {
		var zero Out
		var in In
		if err := json.Unmarshal(raw, &in); err != nil {
			return zero, fmt.Errorf("idemlambda: event does not decode into %T: %w", in, err)
		}
		// The raw event is decoded for JMESPath only when an expression
		// reads it.
		var (
			event any
			id    idem.Identity
			ok    bool
			err   error
		)
		if c.Key == nil || k.validation != nil {
			if event, err = decode(raw); err != nil {
				return zero, err
			}
		}
		if c.Key != nil {
			key, kerr := c.Key(ctx, in)
			switch {
			case kerr != nil:
				return zero, kerr
			case key == "" && k.raise:
				return zero, &MissingKeyError{Expr: "(Key func)"}
			case key == "":
				k.log.Warn("idemlambda: no idempotency key in the event; running unprotected", "operation", k.operation)
			default:
				var fp *[sha256.Size]byte
				if fp, err = k.fingerprint(event); err == nil {
					id, err = clientkey.KeyIdentity(k.operation, "", key, fp)
					ok, id.HoldCrashed = err == nil, k.hold
				}
			}
		} else {
			id, ok, err = k.identity(event)
		}
		if err != nil {
			return zero, err
		}
		if !ok {
			return fn(ctx, in)
		}
		res, err := idem.DoIdentity(idem.EndsAtDeadline(ctx), eng, id, func(ctx context.Context) (Out, error) { return fn(ctx, in) })
		if err == nil && res.Replayed && c.OnReplay != nil {
			return c.OnReplay(ctx, res.Value), nil
		}
		return res.Value, err
	}, nil
}

// WrapRaw makes a byte handler idempotent; the result is a lambda.Handler
// for lambda.Start. See [Wrap].
func WrapRaw(eng *idem.Engine, name string, fn func(context.Context, []byte) ([]byte, error), cfg *Config) (lambda.Handler, error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	k, err := newKeyer(name, cfg, "")
	if err != nil {
		return nil, err
	}
	return rawHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		event, err := decode(payload)
		if err != nil {
			return nil, err
		}
		id, ok, err := k.identity(event)
		if err != nil {
			return nil, err
		}
		if !ok {
			return fn(ctx, payload)
		}
		res, err := idem.DoIdentity(idem.EndsAtDeadline(ctx), eng, id, func(ctx context.Context) ([]byte, error) { return fn(ctx, payload) })
		return res.Value, err
	}), nil
}

type rawHandler func(context.Context, []byte) ([]byte, error)

// Invoke implements lambda.Handler.
func (h rawHandler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	return h(ctx, payload)
}
