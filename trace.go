// Tracing: the span of a call and of each of its store calls, through
// observe.Tracer.

package idem

import (
	"context"

	"github.com/seed-a1b882c0/idem/observe"
)

// Tracing: when Config.Observer is an observe.Tracer, every call has a
// span (call.span) and its store calls child spans. Every hook below
// checks the span first, so that an engine whose observer does not trace
// pays one nil check and nothing else.

// observe tells the observer of an outcome of the call, and the call's
// span when it is traced.
func (c *call) observe(o observe.Outcome) {
	c.e.cfg.Observer.Observe(c.name, o)
	if c.span != nil {
		c.span.Outcome(o)
	}
}

// startSpan begins the call's span (the engine's observer traces) and
// returns the context to run the call with. link is the trace context of
// the call that began the work of a token, if any.
func (c *call) startSpan(ctx context.Context, kind observe.CallKind, link observe.TraceContext) context.Context {
	ctx, c.span = c.e.tracer.StartCall(ctx, observe.Call{Kind: kind, Operation: c.name, Key: c.key, DBSystem: c.e.dbSystem, Link: link})
	return ctx
}

// endSpan ends the call's span, if it has one that has not ended.
func (c *call) endSpan(end observe.CallEnd) {
	if c.span != nil {
		c.span.End(end)
		c.span = nil
	}
}

// storeSpan begins the span of one store call of the call, when it is
// traced, and returns the context to make the store call with.
func (c *call) storeSpan(ctx context.Context, op observe.StoreOp) (context.Context, observe.StoreSpan) {
	if c.span == nil {
		return ctx, nil
	}
	return c.span.StartStore(ctx, op)
}

// endStore ends the span of a store call, if it has one.
func endStore(ss observe.StoreSpan, err error) {
	if ss != nil {
		ss.End(err)
	}
}

// event tells the call's span of ev, when it is traced.
func (c *call) event(ev observe.Event) {
	if c.span != nil {
		c.span.Event(ev)
	}
}

// traceContext is the trace context of the call's span, which the tokens
// it hands out carry: zero when it is not traced.
func (c *call) traceContext() observe.TraceContext {
	if c.span == nil {
		return observe.TraceContext{}
	}
	return c.span.TraceContext()
}

// tokenSpan begins the span of a write through t, linked to the call
// that began t's work when t carries its trace context.
func (e *Engine) tokenSpan(ctx context.Context, kind observe.CallKind, t Token) (context.Context, observe.Span) {
	return e.tracer.StartCall(ctx, observe.Call{Kind: kind, Operation: t.Key.Operation, Key: t.Key.String(), DBSystem: e.dbSystem, Link: t.trace})
}
