// Package idemprom exports idem's outcomes and store latencies as
// Prometheus metrics: an [observe.Observer] that is also a
// [prometheus.Collector], set up in one line.
//
//	eng, err := idem.New(store, &idem.Config{
//		Observer: idemprom.MustNew(prometheus.DefaultRegisterer, nil),
//	})
//
// # Metrics
//
//   - idem_outcomes_total{operation, outcome}, a counter: one per outcome
//     of a call ([observe.Outcome]: acquired, takeover, replayed, cache_hit,
//     in_progress, mismatch, fenced, store_error, complete_failed, failed,
//     released, unprotected, uncertain, write_retried, handed_off).
//     operation is the operation's name (the first part of the key's scope, such as an
//     [idem.Op]'s name or idemhttp's Config.Operation), never the key. The
//     first outcome of an operation exports all of its outcomes at zero;
//     Config.Operations exports them from the start.
//   - idem_store_call_duration_seconds{op, result}, a histogram: the
//     latency of every store call the engine makes. op is the
//     [observe.StoreOp] (claim, complete, fail, release, extend, attach, get),
//     result the [observe.StoreResult] of its error: ok, not_found, fenced,
//     too_large, corrupt, canceled, throttled, unavailable or other. A pair is exported
//     from its first call on. Failed store calls are
//     idem_store_call_duration_seconds_count{result!="ok"}: there is no
//     separate error counter.
//   - idem_clock_offset_seconds and idem_clock_trusted, gauges: the
//     store's clock minus the engine's at its last measurement, and 1
//     while the engine trusts it (known, fresh, within
//     idem.Config.MaxClockOffset) or 0 while it takes no claim over
//     ([observe.ClockObserver]). Exported from the first measurement on:
//     never for a store in the process (memstore, boltstore).
//
// Config.Namespace prefixes every name ("payments" gives
// payments_idem_outcomes_total) and Config.ConstLabels adds labels to each,
// for two engines that share a registry; one Observer may also serve both
// engines, their operations telling them apart.
//
// # Cost
//
// Observe and StoreCall allocate nothing once an operation has been seen:
// the counters of each operation and the histogram of each (op, result)
// pair are looked up once and cached. The first outcome of an operation
// takes a lock and copies a small map.
//
// docs/metrics.md in the repository lists every metric and label with the
// queries that answer the usual questions.
package idemprom
