package idemprom

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
)

// DefaultBuckets are the store call histogram's buckets, in seconds: from
// 100µs (an embedded or in-memory store) to 2.5s (a store timing out).
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// The label names. Config.ConstLabels may not use them.
const (
	// LabelOperation is the operation's name (the first part of the key's scope) on
	// idem_outcomes_total.
	LabelOperation = "operation"
	// LabelOutcome is the [observe.Outcome] on idem_outcomes_total.
	LabelOutcome = "outcome"
	// LabelOp is the [observe.StoreOp] on idem_store_call_duration_seconds.
	LabelOp = "op"
	// LabelResult is the [observe.StoreResult] on
	// idem_store_call_duration_seconds.
	LabelResult = "result"
)

// Config configures an [Observer]. A nil *Config means the defaults.
type Config struct {
	// Namespace is prepended to every metric name with an underscore:
	// "payments" gives payments_idem_outcomes_total. Default none. It must
	// match [a-zA-Z_][a-zA-Z0-9_]*.
	Namespace string
	// ConstLabels are added to every metric, for example to tell apart two
	// engines of one process that register in one registry. Default none.
	// Their names must match [a-zA-Z_][a-zA-Z0-9_]*, must not start with
	// "__" and must not be one of the label names above; their values must
	// be valid UTF-8.
	ConstLabels prometheus.Labels
	// Buckets are the upper bounds of the store call histogram, in seconds,
	// increasing. Default [DefaultBuckets].
	Buckets []float64
	// Operations are exported from the start, every outcome at zero, so that
	// rates and alerts have a series before the first call. Any other
	// operation gets the same on its first outcome. Default none. Each must
	// be a valid operation name (see [idem.StoreKey]).
	Operations []string
}

// WithDefaults returns a copy of c (or of the zero Config, for nil) with
// every unset field set to its default.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Buckets == nil {
		out.Buckets = DefaultBuckets
	}
	out.Buckets = append([]float64(nil), out.Buckets...)
	out.ConstLabels = maps.Clone(out.ConstLabels)
	out.Operations = append([]string(nil), out.Operations...)
	return &out
}

// validate explains what is wrong with a filled Config, in an error that
// wraps [idem.ErrInvalidConfig].
func (c *Config) validate() error {
	var bad []string
	if c.Namespace != "" && (!model.LegacyValidation.IsValidMetricName(c.Namespace) || strings.Contains(c.Namespace, ":")) {
		bad = append(bad, fmt.Sprintf("Namespace %q is not a metric name prefix: use letters, digits and underscores, not starting with a digit", c.Namespace))
	}
	for _, name := range slices.Sorted(maps.Keys(c.ConstLabels)) {
		switch {
		case !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "__"):
			bad = append(bad, fmt.Sprintf("ConstLabels: %q is not a label name: use letters, digits and underscores, not starting with a digit or \"__\"", name))
		case name == LabelOperation || name == LabelOutcome || name == LabelOp || name == LabelResult:
			bad = append(bad, fmt.Sprintf("ConstLabels: %q is a label of idemprom's own metrics: choose another name", name))
		case !utf8.ValidString(c.ConstLabels[name]):
			bad = append(bad, fmt.Sprintf("ConstLabels: the value of %q is not valid UTF-8", name))
		}
	}
	if len(c.Buckets) == 0 {
		bad = append(bad, "Buckets is empty: leave it nil for DefaultBuckets")
	}
	for i := 1; i < len(c.Buckets); i++ {
		if c.Buckets[i] <= c.Buckets[i-1] {
			bad = append(bad, fmt.Sprintf("Buckets must increase: %v follows %v", c.Buckets[i], c.Buckets[i-1]))
			break
		}
	}
	for _, op := range c.Operations {
		if _, err := idem.NewStoreKey(op, "", nil); err != nil {
			bad = append(bad, fmt.Sprintf("Operations: %v", err))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("idemprom: %w: %s", idem.ErrInvalidConfig, strings.Join(bad, "; "))
	}
	return nil
}

// Observer is an [observe.Observer] that keeps its counts in Prometheus
// metrics, and the [prometheus.Collector] that exports them. Set it as
// idem.Config.Observer; one Observer may serve any number of engines. Its methods are safe for concurrent use
// and, once an operation has been seen, allocate nothing.
type Observer struct {
	outcomes *prometheus.CounterVec
	store    *prometheus.HistogramVec

	// byOperation maps an operation to its counters, indexed by outcome. It
	// is replaced, never changed, under mu, so that Observe reads it without
	// a lock.
	byOperation atomic.Pointer[map[string][]prometheus.Counter]
	mu          sync.Mutex

	// calls caches the histogram of each (op, result) pair of the engine's
	// store operations, at opIndex*len(results)+resultIndex, made on first
	// use so that only pairs that occurred are exported.
	calls []atomic.Pointer[storeCall]

	// The clock gauges, exported from the engine's first measurement of
	// its store's clock on (never for a store that is not measured).
	clockOffset, clockTrusted prometheus.Gauge
	clockSeen                 atomic.Bool
}

type storeCall struct{ h prometheus.Observer }

var (
	numOutcomes = len(observe.Outcomes())
	storeOps    = observe.StoreOps()
	results     = observe.StoreResults()
)

// New returns an Observer configured by cfg (nil for the defaults) and
// registers it with reg, unless reg is nil: then register it yourself, it
// is a [prometheus.Collector]. The error says what is wrong with cfg, or
// why reg refused the metrics (a [prometheus.AlreadyRegisteredError] when
// they are registered already: give each Observer its own Namespace or
// ConstLabels, or share one).
func New(reg prometheus.Registerer, cfg *Config) (*Observer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	o := &Observer{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   "idem",
			Name:        "outcomes_total",
			Help:        "Outcomes of idempotent calls by operation: acquired, replayed, cache_hit, in_progress, mismatch, released, uncertain, ... (observe.Outcome).",
			ConstLabels: cfg.ConstLabels,
		}, []string{LabelOperation, LabelOutcome}),
		store: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   "idem",
			Name:        "store_call_duration_seconds",
			Help:        "Latency of idempotency store calls by operation (claim, complete, fail, release, extend, attach, get) and result (ok or an error class).",
			ConstLabels: cfg.ConstLabels,
			Buckets:     cfg.Buckets,
		}, []string{LabelOp, LabelResult}),
		calls: make([]atomic.Pointer[storeCall], len(storeOps)*len(results)),
		clockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   "idem",
			Name:        "clock_offset_seconds",
			Help:        "The store's clock minus this engine's, at the last good measurement (idem.Config.ClockSync).",
			ConstLabels: cfg.ConstLabels,
		}),
		clockTrusted: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace:   cfg.Namespace,
			Subsystem:   "idem",
			Name:        "clock_trusted",
			Help:        "1 when the engine's offset to the store's clock is known, fresh and within idem.Config.MaxClockOffset; 0 while it takes no claim over.",
			ConstLabels: cfg.ConstLabels,
		}),
	}
	o.byOperation.Store(&map[string][]prometheus.Counter{})
	for _, op := range cfg.Operations {
		o.operation(op)
	}
	if reg != nil {
		if err := reg.Register(o); err != nil {
			return nil, fmt.Errorf("idemprom: register: %w", err)
		}
	}
	return o, nil
}

// MustNew is [New] that panics on an error, for package-level setup:
//
//	cfg := &idem.Config{Observer: idemprom.MustNew(prometheus.DefaultRegisterer, nil)}
func MustNew(reg prometheus.Registerer, cfg *Config) *Observer {
	o, err := New(reg, cfg)
	if err != nil {
		panic(err)
	}
	return o
}

// Describe implements [prometheus.Collector].
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	o.outcomes.Describe(ch)
	o.store.Describe(ch)
	o.clockOffset.Describe(ch)
	o.clockTrusted.Describe(ch)
}

// Collect implements [prometheus.Collector].
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	o.outcomes.Collect(ch)
	o.store.Collect(ch)
	if o.clockSeen.Load() {
		o.clockOffset.Collect(ch)
		o.clockTrusted.Collect(ch)
	}
}

// ClockSync implements [observe.ClockObserver]: it sets
// idem_clock_offset_seconds to the measured offset (kept as it was when
// the store could not be asked) and idem_clock_trusted to 1 or 0.
func (o *Observer) ClockSync(s observe.ClockSync) {
	if s.Err == nil {
		o.clockOffset.Set(s.Offset.Seconds())
	}
	trusted := 0.0
	if s.Trusted {
		trusted = 1
	}
	o.clockTrusted.Set(trusted)
	o.clockSeen.Store(true)
}

// Observe implements [observe.Observer]: it counts o in
// idem_outcomes_total{operation, outcome}. The first outcome of an
// operation exports all of that operation's outcomes, at zero.
func (o *Observer) Observe(operation string, outcome observe.Outcome) {
	if outcome < 0 || int(outcome) >= numOutcomes {
		o.outcomes.WithLabelValues(labelValue(operation), outcome.String()).Inc()
		return
	}
	o.operation(operation)[outcome].Inc()
}

// operation returns the counters of an operation, making them on its first
// sight.
func (o *Observer) operation(name string) []prometheus.Counter {
	if c, ok := (*o.byOperation.Load())[name]; ok {
		return c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.byOperation.Load()
	if c, ok := old[name]; ok {
		return c
	}
	c := make([]prometheus.Counter, numOutcomes)
	label := labelValue(name)
	for i := range c {
		c[i] = o.outcomes.WithLabelValues(label, observe.Outcome(i).String())
	}
	next := make(map[string][]prometheus.Counter, len(old)+1)
	maps.Copy(next, old)
	next[name] = c
	o.byOperation.Store(&next)
	return c
}

// StoreCall implements [observe.Observer]: it observes d in
// idem_store_call_duration_seconds{op, result}, result being
// [observe.StoreResultOf](err).
func (o *Observer) StoreCall(op observe.StoreOp, d time.Duration, err error) {
	result := observe.StoreResultOf(err)
	i, j := opIndex(op), resultIndex(result)
	if i < 0 || j < 0 {
		o.store.WithLabelValues(labelValue(string(op)), string(result)).Observe(d.Seconds())
		return
	}
	cell := &o.calls[i*len(results)+j]
	call := cell.Load()
	if call == nil {
		call = &storeCall{h: o.store.WithLabelValues(string(op), string(result))}
		cell.Store(call) // a racing first call stores the same child
	}
	call.h.Observe(d.Seconds())
}

func opIndex(op observe.StoreOp) int { return slices.Index(storeOps, op) }

func resultIndex(r observe.StoreResult) int { return slices.Index(results, r) }

// labelValue makes s a valid label value: the engine's operation names
// always are, but an Observer may be called by other code.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
