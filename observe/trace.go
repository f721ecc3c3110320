package observe

import (
	"context"
	"encoding/hex"
	"time"
)

// Tracer is an [Observer] that also traces: one span per engine call, a
// child span per store call, and events for what happens in between. The
// engine checks for it once, when it is made (idem.New): an Observer that is
// not a Tracer costs nothing more per call, and neither does a call that
// runs while no Tracer is configured.
//
// idemotel's Tracer implements it over OpenTelemetry; its methods must be
// safe for concurrent use.
type Tracer interface {
	Observer
	// StartCall begins the span of one engine call. The engine runs the
	// call with the returned context (the operation sees it), tells the
	// returned Span what happens, and ends it exactly once.
	StartCall(ctx context.Context, c Call) (context.Context, Span)
}

// CallKind names the engine call a span is for.
type CallKind string

// The engine calls that are traced.
const (
	// CallDo: Do, DoIdentity, DoCompleting, Op.Do, one key of DoBatch.
	CallDo CallKind = "do"
	// CallBatch: DoBatch; the span of each key's call is its child.
	CallBatch CallKind = "batch"
	// CallBegin: Engine.Begin.
	CallBegin CallKind = "begin"
	// CallComplete, CallFail, CallRelease, CallExtend, CallAttach: writes
	// through a token (Engine.Complete, ...).
	CallComplete CallKind = "complete"
	CallFail     CallKind = "fail"
	CallRelease  CallKind = "release"
	CallExtend   CallKind = "extend"
	CallAttach   CallKind = "attach"
	// CallStatus: Engine.Status.
	CallStatus CallKind = "status"
)

// Call describes an engine call as it starts.
type Call struct {
	Kind CallKind
	// Operation is the operation's name (the key's scope); empty for a
	// batch.
	Operation string
	// Key is the store key. A tracer must not record it as it is (it may
	// carry a tenant); idemotel records its hash.
	Key string
	// DBSystem is the store's backend, as the database semantic
	// conventions spell db.system.name ("redis", "postgresql",
	// "aws.dynamodb"), when the store names it; else empty.
	DBSystem string
	// Link is the trace context of the call that began the work, for a
	// write through a token that carries one; zero otherwise.
	Link TraceContext
	// BatchSize is the number of keys of a CallBatch.
	BatchSize int
}

// Span is the span of one engine call, as the engine reports to it. Its
// methods are called from the call's goroutine, and from the goroutine
// that renews the call's lease (StartStore, Event); End is called once,
// after every other method.
type Span interface {
	// StartStore begins the child span of one store call, whose parent is
	// this span whatever ctx carries, and returns the context to make the
	// store call with (so that the backend client's own spans are its
	// children). The engine ends the returned StoreSpan once the call
	// returned.
	StartStore(ctx context.Context, op StoreOp) (context.Context, StoreSpan)
	// Outcome tells one outcome of the call, as [Observer.Observe] does.
	Outcome(o Outcome)
	// Event tells something that happened during the call.
	Event(ev Event)
	// TraceContext is the span's trace context, which the tokens handed
	// out by the call carry, so that the work finishing elsewhere can be
	// linked to it. Zero when the span has no valid context.
	TraceContext() TraceContext
	// Context returns ctx carrying the span as the current one, so that
	// spans started under ctx are its children.
	Context(ctx context.Context) context.Context
	// End ends the span.
	End(e CallEnd)
}

// StoreSpan is the span of one store call.
type StoreSpan interface {
	// End ends the span with the store call's error (nil: success).
	End(err error)
}

// EventKind names an [Event].
type EventKind string

// The events of a call.
const (
	// EventWait: the key is held by another caller; the call waits
	// (Config.Wait) Delay before it tries to claim again. Owner and
	// LeaseUntil name the holder; Attempt counts the waits.
	EventWait EventKind = "idem.wait"
	// EventJoin: a duplicate in this process joined the call already in
	// flight for its key, and answers from its claim.
	EventJoin EventKind = "idem.join"
	// EventTakeover: the claim took over a record whose lease had passed;
	// Fence is the new claim's.
	EventTakeover EventKind = "idem.takeover"
	// EventRenew: the lease was renewed until LeaseUntil; Err is set when
	// the renewal failed (it is tried again).
	EventRenew EventKind = "idem.lease.renew"
	// EventLeaseLost: a renewal was refused because another caller took
	// the key over; the operation's context is cancelled.
	EventLeaseLost EventKind = "idem.lease.lost"
	// EventWriteRetry: an outcome write (Op) failed with Err on a
	// transient fault and is tried again after Delay; Attempt is the
	// attempt that failed.
	EventWriteRetry EventKind = "idem.write.retry"
	// EventDetach: the operation handed its claim off (idem.Detach) until
	// LeaseUntil.
	EventDetach EventKind = "idem.detach"
)

// Event is something that happened during a call. Only the fields its Kind
// names are set.
type Event struct {
	Kind       EventKind
	Op         StoreOp
	Attempt    int
	Delay      time.Duration
	Fence      uint64
	Owner      string
	LeaseUntil time.Time
	Err        error
}

// CallEnd is how a call ended.
type CallEnd struct {
	// Replayed: the answer came from an earlier execution.
	Replayed bool
	// Fence is the claim under which the call ran the operation (or
	// wrote through a token), 0 when it held none.
	Fence uint64
	// Err is the error the call returned: the operation's, a replayed
	// terminal error, or the engine's (in progress, mismatch, store).
	Err error
	// Panicked: the operation panicked; the panic goes on up the stack.
	Panicked bool
}

// TraceContext is a span's identity across processes, as W3C Trace Context
// carries it in a traceparent header: a 16-byte trace id, an 8-byte span
// (parent) id and the trace flags. The zero value is no trace context.
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   byte
}

// IsValid reports whether tc names a span: both ids are not all zeros.
func (tc TraceContext) IsValid() bool {
	return tc.TraceID != [16]byte{} && tc.SpanID != [8]byte{}
}

// String returns tc as a traceparent header value
// ("00-<trace id>-<span id>-<flags>"), or "" for an invalid tc.
func (tc TraceContext) String() string {
	if !tc.IsValid() {
		return ""
	}
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tc.TraceID[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, tc.SpanID[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, []byte{tc.Flags})
	return string(b)
}
