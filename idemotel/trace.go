package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// The attributes of the spans a [Tracer] records, besides the database
// semantic conventions' db.system.name, db.operation.name and error.type.
const (
	// AttrIdemOperation is the operation's name (the first part of the key's scope).
	AttrIdemOperation = attribute.Key("idem.operation")
	// AttrKeyHash is [KeyHash] of the store key: never the key itself.
	AttrKeyHash = attribute.Key("idem.key.hash")
	// AttrOutcomeName is the call's outcome ([observe.Outcome]: acquired,
	// replayed, cache_hit, in_progress, mismatch, failed, released, ...).
	AttrOutcomeName = attribute.Key("idem.outcome")
	// AttrReplayed is true when the answer came from an earlier execution.
	AttrReplayed = attribute.Key("idem.replayed")
	// AttrFence is the fence of the claim the call ran under or wrote
	// through; absent when it held none.
	AttrFence = attribute.Key("idem.fence")
	// AttrCall is the engine call ([observe.CallKind]: do, batch, begin,
	// complete, fail, release, extend, attach, status).
	AttrCall = attribute.Key("idem.call")
	// AttrBatchSize is the number of keys of a batch (idem.DoBatch).
	AttrBatchSize = attribute.Key("idem.batch.size")
	// AttrOwner, AttrLeaseUntil, AttrAttempt, AttrDelay and AttrError are
	// attributes of a span's events: the holder met or the claim's owner,
	// a lease's end (RFC 3339), an attempt's number, a pause (ms), and an
	// error's message (the store key in it replaced by its hash).
	AttrOwner      = attribute.Key("idem.owner")
	AttrLeaseUntil = attribute.Key("idem.lease_until")
	AttrAttempt    = attribute.Key("idem.attempt")
	AttrDelay      = attribute.Key("idem.delay_ms")
	AttrError      = attribute.Key("idem.error")
)

// TracerConfig configures a [Tracer]. A nil *TracerConfig means the
// defaults.
type TracerConfig struct {
	// Observer, when set, is told every outcome and store call as well:
	// the metrics, from an [Observer] of this package or from idemprom.
	// Default none.
	Observer observe.Observer
	// DBSystem is the db.system.name of the store spans. Default: the name
	// the store gives itself (store.SystemNamer: "redis", "postgresql",
	// "aws.dynamodb", "memory", "bbolt"), else [DefaultDBSystem].
	DBSystem string
	// AnnotateParent also sets idem.operation, idem.key.hash, idem.outcome,
	// idem.replayed and idem.fence on the span that was current when an
	// engine call began (the HTTP server span of a request, as the
	// gateway's), when that span is recording, so that the request's own
	// span says what idem did. Default off.
	AnnotateParent bool
}

func (c *TracerConfig) validate() error {
	if c != nil && (!utf8.ValidString(c.DBSystem) || strings.TrimSpace(c.DBSystem) != c.DBSystem) {
		return fmt.Errorf("idemotel: %w: DBSystem %q must be valid UTF-8 without surrounding spaces, such as \"redis\"", idem.ErrInvalidConfig, c.DBSystem)
	}
	return nil
}

// Tracer is an [observe.Tracer]: set it as idem.Config.Observer and every
// engine call gets a span, every store call a child span following the
// database semantic conventions, with events for what happens in between
// (see the package doc). It passes outcomes and store calls on to
// TracerConfig.Observer, for metrics. One Tracer may serve any number of
// engines; its methods are safe for concurrent use.
type Tracer struct {
	tracer   trace.Tracer
	cfg      TracerConfig
	dbSystem attribute.KeyValue // from cfg.DBSystem, when set
}

var _ observe.Tracer = (*Tracer)(nil)

// NewTracer returns a Tracer whose spans come from tp's Tracer named
// [ScopeName], or the global TracerProvider's when tp is nil.
func NewTracer(tp trace.TracerProvider, cfg *TracerConfig) (*Tracer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	t := &Tracer{tracer: tp.Tracer(ScopeName)}
	if cfg != nil {
		t.cfg = *cfg
	}
	if t.cfg.DBSystem != "" {
		t.dbSystem = semconv.DBSystemNameKey.String(t.cfg.DBSystem)
	}
	return t, nil
}

// MustNewTracer is [NewTracer] that panics on an error.
func MustNewTracer(tp trace.TracerProvider, cfg *TracerConfig) *Tracer {
	t, err := NewTracer(tp, cfg)
	if err != nil {
		panic(err)
	}
	return t
}

// Observe implements [observe.Observer]: it passes the outcome on to
// TracerConfig.Observer.
func (t *Tracer) Observe(op string, o observe.Outcome) {
	if t.cfg.Observer != nil {
		t.cfg.Observer.Observe(op, o)
	}
}

// StoreCall implements [observe.Observer]: it passes the store call on to
// TracerConfig.Observer.
func (t *Tracer) StoreCall(op observe.StoreOp, d time.Duration, err error) {
	if t.cfg.Observer != nil {
		t.cfg.Observer.StoreCall(op, d, err)
	}
}

// KeyHash is what the spans record of a store key (idem.key.hash): the
// first 16 bytes of its SHA-256, in hex. Compute it from a key
// (idem.StoreKey.String) to find the key's traces.
func KeyHash(storeKey string) string {
	sum := sha256.Sum256([]byte(storeKey))
	return hex.EncodeToString(sum[:16])
}

// StartCall implements [observe.Tracer]: it starts the span "idem.<call>
// <operation>" (internal), linked to c.Link when it is valid.
func (t *Tracer) StartCall(ctx context.Context, c observe.Call) (context.Context, observe.Span) {
	s := &span{t: t, call: c}
	s.outcome.Store(-1)
	name := "idem." + string(c.Kind)
	if c.Kind != observe.CallBatch {
		name += " " + c.Operation
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if c.Link.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: spanContext(c.Link)}))
	}
	if t.cfg.AnnotateParent && c.Kind != observe.CallBatch {
		if p := trace.SpanFromContext(ctx); p.IsRecording() {
			s.parent = p
		}
	}
	ctx, s.span = t.tracer.Start(ctx, name, opts...)
	if !s.span.IsRecording() && s.parent == nil {
		return ctx, s // not sampled: nothing to record
	}
	if c.Kind == observe.CallBatch {
		s.span.SetAttributes(AttrCall.String(string(c.Kind)), AttrBatchSize.Int(c.BatchSize))
	} else {
		s.keyHash = KeyHash(c.Key)
		s.span.SetAttributes(AttrCall.String(string(c.Kind)), AttrIdemOperation.String(labelValue(c.Operation)), AttrKeyHash.String(s.keyHash))
	}
	return ctx, s
}

// spanContext is the remote span context of tc.
func spanContext(tc observe.TraceContext) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tc.TraceID, SpanID: tc.SpanID, TraceFlags: trace.TraceFlags(tc.Flags), Remote: true,
	})
}

// span is the span of one engine call.
type span struct {
	t       *Tracer
	call    observe.Call
	span    trace.Span
	parent  trace.Span // annotated at End (AnnotateParent), when recording
	keyHash string
	// outcome is the last outcome told, -1 before any: the call's
	// outcome. complete_failed stays once told: a result that could not
	// be recorded is what a trace reader needs to see, even when a
	// bounded error marker was stored after it.
	outcome atomic.Int32
}

func (s *span) Context(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, s.span)
}

func (s *span) TraceContext() observe.TraceContext {
	sc := s.span.SpanContext()
	if !sc.IsValid() {
		return observe.TraceContext{}
	}
	return observe.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}
}

func (s *span) Outcome(o observe.Outcome) {
	if observe.Outcome(s.outcome.Load()) != observe.OutcomeCompleteFailed {
		s.outcome.Store(int32(o))
	}
}

func (s *span) Event(ev observe.Event) {
	if !s.span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 4)
	if ev.Op != "" {
		attrs = append(attrs, semconv.DBOperationNameKey.String(string(ev.Op)))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, AttrAttempt.Int(ev.Attempt))
	}
	if ev.Delay > 0 {
		attrs = append(attrs, AttrDelay.Int64(ev.Delay.Milliseconds()))
	}
	if ev.Fence > 0 {
		attrs = append(attrs, AttrFence.Int64(int64(ev.Fence)))
	}
	if ev.Owner != "" {
		attrs = append(attrs, AttrOwner.String(labelValue(ev.Owner)))
	}
	if !ev.LeaseUntil.IsZero() {
		attrs = append(attrs, AttrLeaseUntil.String(ev.LeaseUntil.UTC().Format(time.RFC3339Nano)))
	}
	if ev.Err != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(ErrorType(ev.Err)), AttrError.String(s.scrub(ev.Err.Error())))
	}
	s.span.AddEvent(string(ev.Kind), trace.WithAttributes(attrs...))
}

// scrub replaces the store key in msg by its hash: error messages name
// the key, which a span must not carry.
func (s *span) scrub(msg string) string {
	if s.call.Key == "" {
		return labelValue(msg)
	}
	return labelValue(strings.ReplaceAll(msg, s.call.Key, "key:"+s.keyHash))
}

func (s *span) End(e observe.CallEnd) {
	if !s.span.IsRecording() && s.parent == nil {
		s.span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 4)
	if o := s.outcome.Load(); o >= 0 {
		attrs = append(attrs, AttrOutcomeName.String(observe.Outcome(o).String()))
	}
	if s.call.Kind != observe.CallBatch {
		attrs = append(attrs, AttrReplayed.Bool(e.Replayed))
	}
	if e.Fence > 0 {
		attrs = append(attrs, AttrFence.Int64(int64(e.Fence)))
	}
	s.span.SetAttributes(attrs...)
	if s.parent != nil {
		s.parent.SetAttributes(AttrIdemOperation.String(labelValue(s.call.Operation)), AttrKeyHash.String(s.keyHash))
		s.parent.SetAttributes(attrs...)
	}
	switch {
	case e.Panicked:
		s.span.SetAttributes(semconv.ErrorTypeKey.String("panic"))
		s.span.SetStatus(codes.Error, "the operation panicked")
	case e.Err != nil:
		s.span.SetAttributes(semconv.ErrorTypeKey.String(ErrorType(e.Err)))
		s.span.SetStatus(codes.Error, s.scrub(e.Err.Error()))
	}
	s.span.End()
}

func (s *span) StartStore(ctx context.Context, op observe.StoreOp) (context.Context, observe.StoreSpan) {
	sys := s.t.dbSystem
	if !sys.Valid() {
		name := s.call.DBSystem
		if name == "" {
			name = DefaultDBSystem
		}
		sys = semconv.DBSystemNameKey.String(name)
	}
	ctx = trace.ContextWithSpan(ctx, s.span)
	ctx, ss := s.t.tracer.Start(ctx, string(op), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(sys, semconv.DBOperationNameKey.String(string(op))))
	return ctx, storeSpan{span: ss, call: s}
}

// storeSpan is the span of one store call.
type storeSpan struct {
	span trace.Span
	call *span
}

func (ss storeSpan) End(err error) {
	if err != nil && ss.span.IsRecording() {
		r := observe.StoreResultOf(err)
		if r == observe.StoreOtherError {
			ss.span.SetAttributes(semconv.ErrorTypeOther)
		} else {
			ss.span.SetAttributes(semconv.ErrorTypeKey.String(string(r)))
		}
		ss.span.SetStatus(codes.Error, ss.call.scrub(err.Error()))
	}
	ss.span.End()
}

// ErrorType is the error.type a span records for err: the kind of idem's
// typed errors (in_progress, mismatch, terminal, stale_token,
// invalid_token, lease_lost, uncertain, result_too_large, invalid_key,
// invalid_payload, invalid_config), "store_" and the [observe.StoreResult]
// of a store failure, the engine's or a store's own (store_unavailable,
// store_fenced, ...), canceled and
// deadline_exceeded for a context's end, else "_OTHER".
func ErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, idem.ErrInProgress):
		return "in_progress"
	case errors.Is(err, idem.ErrMismatch):
		return "mismatch"
	case errors.Is(err, idem.ErrStaleToken):
		return "stale_token"
	case errors.Is(err, idem.ErrInvalidToken):
		return "invalid_token"
	case errors.Is(err, idem.ErrResultTooLarge):
		return "result_too_large"
	case errors.Is(err, idem.ErrTerminal):
		return "terminal"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, idem.ErrUncertain):
		return "uncertain"
	case errors.Is(err, idem.ErrStore), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrFenced),
		errors.Is(err, store.ErrTooLarge), errors.Is(err, store.ErrCorrupt), errors.Is(err, store.ErrUnavailable):
		return "store_" + string(observe.StoreResultOf(err))
	case errors.Is(err, idem.ErrInvalidKey):
		return "invalid_key"
	case errors.Is(err, idem.ErrInvalidPayload):
		return "invalid_payload"
	case errors.Is(err, idem.ErrInvalidConfig):
		return "invalid_config"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}
