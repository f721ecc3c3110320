// Package idemotel records idem's outcomes and store latencies with
// OpenTelemetry metrics: an [observe.Observer] over a [metric.Meter], set up
// in one line; and traces every engine call with a [Tracer].
//
//	eng, err := idem.New(store, &idem.Config{
//		Observer: idemotel.MustNew(otel.Meter("payments"), nil),
//	})
//
// It uses the OpenTelemetry metric API only; the application chooses the
// SDK and exporter. With a nil Meter it takes the global MeterProvider's
// Meter named [ScopeName].
//
// # Instruments
//
//   - idem.outcomes, an Int64Counter (unit {outcome}) with the attributes
//     operation (the operation's name, the first part of the key's scope; never the key) and
//     outcome ([observe.Outcome]: acquired, takeover, replayed, cache_hit,
//     in_progress, mismatch, fenced, store_error, complete_failed, failed,
//     released, unprotected, uncertain, write_retried, handed_off). The
//     first outcome of an operation records 0 for all of its outcomes;
//     Config.Operations does so from the start. Through a Prometheus
//     exporter it becomes idem_outcomes_total{operation, outcome}, the
//     same series as package idemprom's.
//   - db.client.operation.duration, a Float64Histogram in seconds, as the
//     OpenTelemetry database semantic conventions define it, with the
//     bucket boundaries they advise ([DefaultBuckets]). Attributes:
//     db.system.name, "idem" unless Config.DBSystem names the backend;
//     db.operation.name, the [observe.StoreOp] (claim, complete, fail,
//     release, extend, attach, get); error.type on a failed call only, the
//     [observe.StoreResult] of its error (not_found, fenced, too_large,
//     corrupt, canceled, unavailable) or "_OTHER". A store call is one call
//     of the idem store contract: one request to the backend, or a few.
//   - idem.clock.offset, a Float64Gauge in seconds, and
//     idem.clock.trusted, an Int64Gauge: the store's clock minus the
//     engine's at its last measurement, and 1 while the engine trusts it
//     (known, fresh, within idem.Config.MaxClockOffset) or 0 while it takes
//     no claim over ([observe.ClockObserver]). Recorded from the first
//     measurement on; through a Prometheus exporter they become
//     idem_clock_offset_seconds and idem_clock_trusted, as in idemprom.
//
// The Observer interface carries no context, so measurements are recorded
// with context.Background(): no exemplars link them to traces.
//
// # Cost
//
// Observe and StoreCall allocate nothing themselves once an operation has
// been seen: their attribute sets are built once and cached. What the SDK
// does with a measurement is the SDK's (see the benchmarks).
//
// docs/metrics.md in the repository lists every instrument and attribute.
//
// # Traces
//
// A [Tracer] is an [observe.Tracer] over a trace.TracerProvider: the
// engine gives every call a span ("idem.do charge", "idem.complete
// charge", ...) and every store call a child span of kind client following
// the database semantic conventions (db.system.name, db.operation.name,
// error.type), with events for in-progress waits, lease renewals,
// takeovers, lost leases, outcome-write retries and hand-offs. A call's
// span has idem.operation, idem.key.hash ([KeyHash]: never the key or the
// payload), idem.outcome, idem.replayed, idem.fence, and error.type
// ([ErrorType]) when it failed. Metrics go on through
// TracerConfig.Observer:
//
//	eng, err := idem.New(store, &idem.Config{
//		Observer: idemotel.MustNewTracer(nil, &idemotel.TracerConfig{
//			Observer: idemotel.MustNew(nil, nil),
//		}),
//	})
//
// A token handed out by a traced call carries the call's W3C trace
// context, and the span of a write through it, in any process, is linked
// to that call's span. An engine whose Observer is not a Tracer makes no
// span and allocates nothing more. docs/tracing.md in the repository has
// the whole picture.
package idemotel
