package idemotel

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/dbconv"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
)

// ScopeName is the instrumentation scope of the Meter that [New] takes
// from the global MeterProvider when given none.
const ScopeName = "github.com/seed-a1b882c0/idem/idemotel"

// The names of the instruments and of their attributes.
const (
	// OutcomesName is the counter of outcomes.
	OutcomesName = "idem.outcomes"
	// StoreCallDurationName is the histogram of store calls, the database
	// semantic conventions' client operation duration.
	StoreCallDurationName = "db.client.operation.duration"
	// ClockOffsetName is the gauge of the store's clock minus the engine's,
	// in seconds, at the engine's last good measurement.
	ClockOffsetName = "idem.clock.offset"
	// ClockTrustedName is the gauge that is 1 while the engine trusts its
	// offset to the store's clock and 0 while it takes no claim over.
	ClockTrustedName = "idem.clock.trusted"
	// AttrOperation is the operation's name (the first part of the key's scope) on
	// idem.outcomes.
	AttrOperation = attribute.Key("operation")
	// AttrOutcome is the [observe.Outcome] on idem.outcomes.
	AttrOutcome = attribute.Key("outcome")
	// DefaultDBSystem is the default of Config.DBSystem.
	DefaultDBSystem = "idem"
)

// DefaultBuckets are the bucket boundaries advised for
// db.client.operation.duration, in seconds, by the database semantic
// conventions.
var DefaultBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}

// Config configures an [Observer]. A nil *Config means the defaults.
type Config struct {
	// DBSystem is the db.system.name of every store call. Default
	// [DefaultDBSystem], "idem": a store call is a call of the idem store
	// contract, one or a few requests to the backend, not one request. Set
	// the backend's semantic-convention name ("redis", "postgresql",
	// "aws.dynamodb") to see idem's calls next to the backend's own; if the
	// backend's client is instrumented too, both then report
	// db.client.operation.duration under that name, and a sum over it counts
	// each request twice.
	DBSystem string
	// Operations have every outcome recorded at zero from the start, so
	// that rates have a series before the first call. Any other operation
	// gets the same on its first outcome. Default none. Each must be a
	// valid operation name (see [idem.StoreKey]).
	Operations []string
}

// WithDefaults returns a copy of c (or of the zero Config, for nil) with
// every unset field set to its default.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.DBSystem == "" {
		out.DBSystem = DefaultDBSystem
	}
	out.Operations = append([]string(nil), out.Operations...)
	return &out
}

// validate explains what is wrong with a filled Config, in an error that
// wraps [idem.ErrInvalidConfig].
func (c *Config) validate() error {
	var bad []string
	if !utf8.ValidString(c.DBSystem) || strings.TrimSpace(c.DBSystem) != c.DBSystem {
		bad = append(bad, fmt.Sprintf("DBSystem %q must be valid UTF-8 without surrounding spaces, such as \"redis\"", c.DBSystem))
	}
	for _, op := range c.Operations {
		if _, err := idem.NewStoreKey(op, "", nil); err != nil {
			bad = append(bad, fmt.Sprintf("Operations: %v", err))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("idemotel: %w: %s", idem.ErrInvalidConfig, strings.Join(bad, "; "))
	}
	return nil
}

// Observer is an [observe.Observer] that records outcomes and store calls
// with OpenTelemetry metric instruments. Set it as idem.Config.Observer;
// one Observer may serve any number of engines. Its methods are safe for
// concurrent use and, once an operation has been seen, allocate nothing
// themselves (the SDK behind the Meter may).
type Observer struct {
	outcomes metric.Int64Counter
	duration metric.Float64Histogram
	dbSystem attribute.KeyValue

	clockOffset  metric.Float64Gauge
	clockTrusted metric.Int64Gauge

	// byOperation maps an operation to its measurement options, indexed by
	// outcome. It is replaced, never changed, under mu, so that Observe
	// reads it without a lock.
	byOperation atomic.Pointer[map[string][][]metric.AddOption]
	mu          sync.Mutex

	// calls holds the options of each (op, result) pair of the engine's
	// store operations, at opIndex*len(results)+resultIndex.
	calls [][]metric.RecordOption
}

var (
	numOutcomes = len(observe.Outcomes())
	storeOps    = observe.StoreOps()
	results     = observe.StoreResults()
)

// New returns an Observer that makes its instruments with meter, or with
// the global MeterProvider's Meter named [ScopeName] when meter is nil. cfg
// nil means the defaults. The error says what is wrong with cfg, or why
// the meter refused an instrument.
func New(meter metric.Meter, cfg *Config) (*Observer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if meter == nil {
		meter = otel.Meter(ScopeName)
	}
	outcomes, err := meter.Int64Counter(OutcomesName,
		metric.WithDescription("Outcomes of idempotent calls by operation: acquired, replayed, cache_hit, in_progress, mismatch, released, uncertain, ... (observe.Outcome)."),
		metric.WithUnit("{outcome}"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: %s: %w", OutcomesName, err)
	}
	duration, err := dbconv.NewClientOperationDuration(meter, metric.WithExplicitBucketBoundaries(DefaultBuckets...))
	if err != nil {
		return nil, fmt.Errorf("idemotel: %s: %w", StoreCallDurationName, err)
	}
	clockOffset, err := meter.Float64Gauge(ClockOffsetName,
		metric.WithDescription("The store's clock minus this engine's, at the last good measurement (idem.Config.ClockSync)."),
		metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: %s: %w", ClockOffsetName, err)
	}
	clockTrusted, err := meter.Int64Gauge(ClockTrustedName,
		metric.WithDescription("1 when the engine's offset to the store's clock is known, fresh and within idem.Config.MaxClockOffset; 0 while it takes no claim over."))
	if err != nil {
		return nil, fmt.Errorf("idemotel: %s: %w", ClockTrustedName, err)
	}
	o := &Observer{
		clockOffset:  clockOffset,
		clockTrusted: clockTrusted,
		outcomes:     outcomes,
		duration:     duration.Inst(),
		dbSystem:     semconv.DBSystemNameKey.String(cfg.DBSystem),
		calls:        make([][]metric.RecordOption, len(storeOps)*len(results)),
	}
	for i, op := range storeOps {
		for j, r := range results {
			o.calls[i*len(results)+j] = []metric.RecordOption{metric.WithAttributeSet(o.storeAttrs(op, r))}
		}
	}
	o.byOperation.Store(&map[string][][]metric.AddOption{})
	for _, op := range cfg.Operations {
		o.operation(op)
	}
	return o, nil
}

// MustNew is [New] that panics on an error, for package-level setup:
//
//	cfg := &idem.Config{Observer: idemotel.MustNew(otel.Meter("payments"), nil)}
func MustNew(meter metric.Meter, cfg *Config) *Observer {
	o, err := New(meter, cfg)
	if err != nil {
		panic(err)
	}
	return o
}

// ClockSync implements [observe.ClockObserver]: it records the measured
// offset in idem.clock.offset (not when the store could not be asked) and
// 1 or 0 in idem.clock.trusted. Neither is recorded for an engine whose
// store is not measured (memstore, boltstore).
func (o *Observer) ClockSync(s observe.ClockSync) {
	ctx := context.Background()
	if s.Err == nil {
		o.clockOffset.Record(ctx, s.Offset.Seconds())
	}
	var trusted int64
	if s.Trusted {
		trusted = 1
	}
	o.clockTrusted.Record(ctx, trusted)
}

// Observe implements [observe.Observer]: it adds 1 to idem.outcomes with the
// attributes operation and outcome. The first outcome of an operation adds
// 0 to all of its outcomes, so that each has a series.
func (o *Observer) Observe(operation string, outcome observe.Outcome) {
	if outcome < 0 || int(outcome) >= numOutcomes {
		o.outcomes.Add(context.Background(), 1, metric.WithAttributes(AttrOperation.String(labelValue(operation)), AttrOutcome.String(outcome.String())))
		return
	}
	o.outcomes.Add(context.Background(), 1, o.operation(operation)[outcome]...)
}

// operation returns the options of an operation's outcomes, making them
// (and recording 0 for each) on its first sight.
func (o *Observer) operation(name string) [][]metric.AddOption {
	if c, ok := (*o.byOperation.Load())[name]; ok {
		return c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byOperation.Load()
	if c, ok := old[name]; ok {
		return c
	}
	c := make([][]metric.AddOption, numOutcomes)
	label := AttrOperation.String(labelValue(name))
	for i := range c {
		c[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(label, AttrOutcome.String(observe.Outcome(i).String())))}
		o.outcomes.Add(context.Background(), 0, c[i]...)
	}
	next := make(map[string][][]metric.AddOption, len(old)+1)
	maps.Copy(next, old)
	next[name] = c
	o.byOperation.Store(&next)
	return c
}

// StoreCall implements [observe.Observer]: it records d, in seconds, in
// db.client.operation.duration with the attributes db.system.name
// (Config.DBSystem), db.operation.name (op) and, when err is not nil,
// error.type (the [observe.StoreResult] of err, "_OTHER" for
// [observe.StoreOtherError]).
func (o *Observer) StoreCall(op observe.StoreOp, d time.Duration, err error) {
	result := observe.StoreResultOf(err)
	i, j := opIndex(op), resultIndex(result)
	if i < 0 || j < 0 {
		o.duration.Record(context.Background(), d.Seconds(), metric.WithAttributeSet(o.storeAttrs(op, result)))
		return
	}
	o.duration.Record(context.Background(), d.Seconds(), o.calls[i*len(results)+j]...)
}

// storeAttrs returns the attributes of one store call.
func (o *Observer) storeAttrs(op observe.StoreOp, r observe.StoreResult) attribute.Set {
	kv := []attribute.KeyValue{o.dbSystem, semconv.DBOperationNameKey.String(labelValue(string(op)))}
	switch r {
	case observe.StoreOK:
	case observe.StoreOtherError:
		kv = append(kv, semconv.ErrorTypeOther)
	default:
		kv = append(kv, semconv.ErrorTypeKey.String(string(r)))
	}
	return attribute.NewSet(kv...)
}

func opIndex(op observe.StoreOp) int { return slices.Index(storeOps, op) }

func resultIndex(r observe.StoreResult) int { return slices.Index(results, r) }

// labelValue makes s valid UTF-8: the engine's operation names always
// are, but an Observer may be called by other code.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
