// Op: an operation typed by its input and output, whose key and
// fingerprint come from the input.

package idem

import (
	"context"
	"encoding/json"
	"fmt"
)

// OpConfig configures an [Op]. A nil *OpConfig means all defaults.
type OpConfig[In, Out any] struct {
	// Key returns the idempotency key material of an input. Default: the
	// whole input, encoded as JSON and canonicalised, so equal inputs
	// share a key.
	Key func(in In) (string, error)
	// Payload returns the bytes to fingerprint, as JSON. Default: the whole
	// input, encoded with encoding/json. Return a selection of the input
	// to ignore fields that legitimately vary between retries (timestamps,
	// trace IDs).
	Payload func(in In) ([]byte, error)
	// Tenant returns the tenant or principal that scopes the key. Default:
	// none.
	Tenant func(ctx context.Context, in In) string
	// HoldCrashed sets this operation's takeover policy to Hold (see
	// Config.HoldCrashed). Default false: the engine's policy.
	HoldCrashed bool
	// OnReplay, when set, may adjust a replayed value before it is
	// returned (for example to mark a response as replayed).
	OnReplay func(ctx context.Context, out Out) Out
}

// Op is an operation func(ctx, In) (Out, error) made idempotent: the key is
// taken from the input. Pick it for an operation called from many places,
// typed in and out. Create it once with [NewOp] and call [Op.Do].
type Op[In, Out any] struct {
	e    *Engine
	name string
	fn   func(context.Context, In) (Out, error)
	cfg  OpConfig[In, Out]
}

// NewOp wraps fn as the operation name (the first part of the key's scope) on engine e.
func NewOp[In, Out any](e *Engine, name string, fn func(context.Context, In) (Out, error), cfg *OpConfig[In, Out]) (*Op[In, Out], error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: operation %s has a nil function", ErrInvalidConfig, name)
	}
	o := &Op[In, Out]{e: e, name: name, fn: fn}
	if cfg != nil {
		o.cfg = *cfg
	}
	return o, nil
}

// Do runs the operation at most once per key derived from in; see
// [DoIdentity] for the semantics. The key and fingerprint are computed
// before the operation runs, so a later mutation of in changes nothing.
func (o *Op[In, Out]) Do(ctx context.Context, in In) (Result[Out], error) {
	req := Request{Operation: o.name, HoldCrashed: o.cfg.HoldCrashed}
	var err error
	if o.cfg.Payload != nil {
		req.Payload, err = o.cfg.Payload(in)
	} else {
		req.Payload, err = json.Marshal(in)
	}
	if err != nil {
		return Result[Out]{}, fmt.Errorf("%w: encoding the input of %s: %v", ErrInvalidPayload, o.name, err)
	}
	if o.cfg.Key != nil {
		if req.Key, err = o.cfg.Key(in); err != nil {
			return Result[Out]{}, fmt.Errorf("%w: key function of %s: %v", ErrInvalidKey, o.name, err)
		}
		if req.Key == "" {
			return Result[Out]{}, &KeyError{Field: "key", Reason: "the key function of " + o.name + " returned an empty key"}
		}
	}
	if o.cfg.Tenant != nil {
		req.Tenant = o.cfg.Tenant(ctx, in)
	}
	id, err := req.Identity()
	if err != nil {
		return Result[Out]{}, err
	}
	res, err := DoIdentity(ctx, o.e, id, func(ctx context.Context) (Out, error) { return o.fn(ctx, in) })
	if res.Replayed && err == nil && o.cfg.OnReplay != nil {
		res.Value = o.cfg.OnReplay(ctx, res.Value)
	}
	return res, err
}

// Func returns the operation with its original signature, for code that
// does not care whether a value was replayed.
func (o *Op[In, Out]) Func() func(context.Context, In) (Out, error) {
	return func(ctx context.Context, in In) (Out, error) {
		res, err := o.Do(ctx, in)
		return res.Value, err
	}
}
