package idemsfn_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// linkTracer is an observe.Tracer that gives every call a trace context
// of its own and records each call with its link.
type linkTracer struct {
	observe.Counters
	mu    sync.Mutex
	n     byte
	calls []tracedCall
}

type tracedCall struct {
	observe.Call
	tc observe.TraceContext
}

func (l *linkTracer) StartCall(ctx context.Context, c observe.Call) (context.Context, observe.Span) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	tc := observe.TraceContext{Flags: 1}
	tc.TraceID[0], tc.SpanID[0] = l.n, l.n
	l.calls = append(l.calls, tracedCall{c, tc})
	return ctx, linkSpan{tc}
}

// last returns the last call of kind.
func (l *linkTracer) last(kind observe.CallKind) tracedCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.calls) - 1; i >= 0; i-- {
		if l.calls[i].Kind == kind {
			return l.calls[i]
		}
	}
	return tracedCall{}
}

type linkSpan struct{ tc observe.TraceContext }

func (linkSpan) StartStore(ctx context.Context, _ observe.StoreOp) (context.Context, observe.StoreSpan) {
	return ctx, nil
}
func (linkSpan) Outcome(observe.Outcome)                     {}
func (linkSpan) Event(observe.Event)                         {}
func (s linkSpan) TraceContext() observe.TraceContext        { return s.tc }
func (linkSpan) Context(ctx context.Context) context.Context { return ctx }
func (linkSpan) End(observe.CallEnd)                         {}

// tracedRig is newRig with a traced engine.
func tracedRig(t *testing.T) (rig, *linkTracer) {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	fs := faultstore.New(mem)
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	tr := &linkTracer{}
	e, err := idem.New(counted{fs, mem}, &idem.Config{Clock: clock, Expiry: 24 * time.Hour, Logger: slog.New(slog.DiscardHandler), Observer: tr})
	if err != nil {
		t.Fatal(err)
	}
	return rig{e: e, clock: clock, fs: fs}, tr
}

// The outcome of an execution is recorded in spans linked to the span of
// the Start that began it, whichever way it comes: a worker's Complete
// through the execution's token, an "Execution Status Change" event, or
// the reconciler (the link is read from the execution's input).
func TestSettlementsAreLinkedToTheStart(t *testing.T) {
	t.Parallel()
	r, tr := tracedRig(t)
	api := newFakeSFN()
	s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute})
	start := func(k string) (observe.TraceContext, fakeExec) {
		t.Helper()
		got, err := s.Start(ctx, req(k), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tr.last(observe.CallBegin).tc, api.byArn(got.ExecutionArn)
	}
	linked := func(what string, kind observe.CallKind, began observe.TraceContext) {
		t.Helper()
		c := tr.last(kind)
		if c.Link != began {
			t.Errorf("%s: the %s is linked to %q, want the Start's %q", what, kind, c.Link, began)
		}
	}

	// A worker completes through the token of the execution's input.
	began, x := start("by-worker")
	if err := s.Complete(ctx, envelope(t, x.input).Idem.Token, json.RawMessage(`{"ok":1}`)); err != nil {
		t.Fatal(err)
	}
	linked("worker", observe.CallComplete, began)

	// An event, which carries the input.
	began, x = start("by-event")
	out := `{"ok":2}`
	api.finish(x.name, types.ExecutionStatusSucceeded, out, "", "")
	ev := statusEvent(x.arn, machineArn, x.name, "SUCCEEDED", x.input, &out, nil, nil)
	if h, err := s.HandleEvent(ctx, ev); err != nil || h.Action != idemsfn.ActionCompleted {
		t.Fatalf("%+v %v", h, err)
	}
	linked("event", observe.CallComplete, began)

	// The reconciler, which describes the execution.
	began, x = start("by-reconciler")
	api.finish(x.name, types.ExecutionStatusFailed, "", "PaymentDeclined", "card expired")
	r.clock.Advance(2 * time.Minute)
	rc := reconciler(t, s, nil)
	if rep, err := rc.RunOnce(ctx); err != nil || rep.Failed != 1 {
		t.Fatalf("%+v %v", rep, err)
	}
	linked("reconciler", observe.CallFail, began)
}
