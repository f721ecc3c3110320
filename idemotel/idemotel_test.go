package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is an Observer on an SDK MeterProvider read by a ManualReader.
type env struct {
	obs    *idemotel.Observer
	reader *sdkmetric.ManualReader
}

func setup(t *testing.T, cfg *idemotel.Config) *env {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	obs, err := idemotel.New(mp.Meter("test"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{obs: obs, reader: reader}
}

// metric collects and returns the named metric, failing when it is absent.
func (e *env) metric(t *testing.T, name string) metricdata.Metrics {
	t.Helper()
	m, ok := collect(t, e.reader)[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return m
}

func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// outcomes returns the expected idem.outcomes data: every outcome of each
// operation, with the given counts and 0 for the others.
func outcomes(counts map[string]map[observe.Outcome]int64) metricdata.Metrics {
	var points []metricdata.DataPoint[int64]
	for op, byOutcome := range counts {
		for _, o := range observe.Outcomes() {
			points = append(points, metricdata.DataPoint[int64]{
				Attributes: attribute.NewSet(idemotel.AttrOperation.String(op), idemotel.AttrOutcome.String(o.String())),
				Value:      byOutcome[o],
			})
		}
	}
	return metricdata.Metrics{
		Name:        "idem.outcomes",
		Description: "Outcomes of idempotent calls by operation: acquired, replayed, cache_hit, in_progress, mismatch, released, uncertain, ... (observe.Outcome).",
		Unit:        "{outcome}",
		Data:        metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: points},
	}
}

func TestObserveCountsEveryOutcomeOfAnOperationSeen(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	if _, ok := collect(t, e.reader)["idem.outcomes"]; ok {
		t.Error("idem.outcomes has data before any call")
	}
	e.obs.Observe("charge", observe.OutcomeAcquired)
	e.obs.Observe("charge", observe.OutcomeReplayed)
	e.obs.Observe("charge", observe.OutcomeReplayed)
	e.obs.Observe("refund", observe.OutcomeMismatch)
	want := outcomes(map[string]map[observe.Outcome]int64{
		"charge": {observe.OutcomeAcquired: 1, observe.OutcomeReplayed: 2},
		"refund": {observe.OutcomeMismatch: 1},
	})
	metricdatatest.AssertEqual(t, want, e.metric(t, "idem.outcomes"), metricdatatest.IgnoreTimestamp())
}

func TestConfigOperationsAreRecordedFromTheStart(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemotel.Config{Operations: []string{"charge"}})
	want := outcomes(map[string]map[observe.Outcome]int64{"charge": {}})
	metricdatatest.AssertEqual(t, want, e.metric(t, "idem.outcomes"), metricdatatest.IgnoreTimestamp())
}

// storePoint is the expected data point of one store call of d seconds.
func storePoint(attrs []attribute.KeyValue, d ...float64) metricdata.HistogramDataPoint[float64] {
	p := metricdata.HistogramDataPoint[float64]{
		Attributes:   attribute.NewSet(attrs...),
		Count:        uint64(len(d)),
		Bounds:       idemotel.DefaultBuckets,
		BucketCounts: make([]uint64, len(idemotel.DefaultBuckets)+1),
	}
	lo, hi := d[0], d[0]
	for _, v := range d {
		p.Sum += v
		i := 0
		for i < len(p.Bounds) && v > p.Bounds[i] {
			i++
		}
		p.BucketCounts[i]++
		lo, hi = min(lo, v), max(hi, v)
	}
	p.Min, p.Max = metricdata.NewExtrema(lo), metricdata.NewExtrema(hi)
	return p
}

func TestStoreCallFollowsTheDatabaseSemanticConventions(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.obs.StoreCall(observe.StoreClaim, 2*time.Millisecond, nil)
	e.obs.StoreCall(observe.StoreClaim, 20*time.Millisecond, nil)
	e.obs.StoreCall(observe.StoreComplete, time.Millisecond, &store.FencedError{Key: "k"})
	e.obs.StoreCall(observe.StoreClaim, 2*time.Second, fmt.Errorf("redisstore: claim k: %w: %w", store.ErrUnavailable, errors.New("i/o timeout")))
	e.obs.StoreCall(observe.StoreGet, 500*time.Microsecond, store.ErrNotFound)
	e.obs.StoreCall(observe.StoreRelease, time.Millisecond, errors.New("untranslated"))

	system := attribute.String("db.system.name", "idem")
	op := func(s string) attribute.KeyValue { return attribute.String("db.operation.name", s) }
	errType := func(s string) attribute.KeyValue { return attribute.String("error.type", s) }
	want := metricdata.Metrics{
		Name:        "db.client.operation.duration",
		Description: "Duration of database client operations.",
		Unit:        "s",
		Data: metricdata.Histogram[float64]{
			Temporality: metricdata.CumulativeTemporality,
			DataPoints: []metricdata.HistogramDataPoint[float64]{
				storePoint([]attribute.KeyValue{system, op("claim")}, 0.002, 0.020),
				storePoint([]attribute.KeyValue{system, op("complete"), errType("fenced")}, 0.001),
				storePoint([]attribute.KeyValue{system, op("claim"), errType("unavailable")}, 2),
				storePoint([]attribute.KeyValue{system, op("get"), errType("not_found")}, 0.0005),
				storePoint([]attribute.KeyValue{system, op("release"), errType("_OTHER")}, 0.001),
			},
		},
	}
	metricdatatest.AssertEqual(t, want, e.metric(t, "db.client.operation.duration"), metricdatatest.IgnoreTimestamp())
}

func TestDBSystemNamesTheBackend(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemotel.Config{DBSystem: "redis"})
	e.obs.StoreCall(observe.StoreClaim, time.Millisecond, nil)
	m := e.metric(t, "db.client.operation.duration")
	metricdatatest.AssertHasAttributes(t, m, attribute.String("db.system.name", "redis"), attribute.String("db.operation.name", "claim"))
}

// A store operation or outcome this version of idemotel does not know (a
// newer idem) is still recorded, under its own name.
func TestUnknownStoreOpAndOutcomeAreRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	e.obs.StoreCall(observe.StoreOp("scan"), time.Millisecond, nil)
	e.obs.Observe("charge\xff", observe.Outcome(1000))
	got := collect(t, e.reader)
	metricdatatest.AssertHasAttributes(t, got["db.client.operation.duration"], attribute.String("db.operation.name", "scan"))
	metricdatatest.AssertHasAttributes(t, got["idem.outcomes"], idemotel.AttrOperation.String("charge\uFFFD"), idemotel.AttrOutcome.String("unknown"))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  idemotel.Config
		want string
	}{
		{"db system not UTF-8", idemotel.Config{DBSystem: "\xff"}, "DBSystem"},
		{"db system with spaces", idemotel.Config{DBSystem: " redis"}, "DBSystem"},
		{"invalid operation", idemotel.Config{Operations: []string{"has space"}}, "Operations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemotel.New(sdkmetric.NewMeterProvider().Meter("test"), &tc.cfg)
			if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want idem.ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestMustNewPanicsOnInvalidConfig(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("MustNew did not panic")
		}
	}()
	idemotel.MustNew(sdkmetric.NewMeterProvider().Meter("test"), &idemotel.Config{Operations: []string{""}})
}

// A nil Meter means the global MeterProvider's, under ScopeName. (Not
// parallel: it sets the global MeterProvider, which no other test uses.)
func TestNilMeterUsesTheGlobalProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	otel.SetMeterProvider(mp)
	idemotel.MustNew(nil, nil).Observe("charge", observe.OutcomeAcquired)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if len(rm.ScopeMetrics) != 1 || rm.ScopeMetrics[0].Scope.Name != idemotel.ScopeName {
		t.Fatalf("scopes %+v, want one named %s", rm.ScopeMetrics, idemotel.ScopeName)
	}
}

// The Observer through an engine: what a user of idem.Do sees.
func TestThroughTheEngine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	mem := memstore.New(nil)
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Observer: e.obs})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.Request{Operation: "charge", Key: "k1", Payload: []byte(`{"amount":1}`)}
	for range 2 {
		if _, err := idem.Do(context.Background(), eng, req, func(context.Context) (string, error) { return "ok", nil }); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, e.reader)
	want := outcomes(map[string]map[observe.Outcome]int64{"charge": {observe.OutcomeAcquired: 1, observe.OutcomeReplayed: 1}})
	metricdatatest.AssertEqual(t, want, got["idem.outcomes"], metricdatatest.IgnoreTimestamp())
	calls := map[string]uint64{}
	for _, p := range got["db.client.operation.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
		name, _ := p.Attributes.Value("db.operation.name")
		if _, failed := p.Attributes.Value("error.type"); failed {
			t.Errorf("a failed store call: %v", p.Attributes.ToSlice())
		}
		calls[name.AsString()] += p.Count
	}
	if calls["claim"] != 2 || calls["complete"] != 1 {
		t.Errorf("store calls %v, want 2 claims and 1 complete", calls)
	}
}

// Concurrent first sights of operations: every count lands once (run with
// -race, -count=50).
func TestConcurrentFirstSight(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	const goroutines, per = 8, 50
	ops := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				e.obs.Observe(ops[(g+i)%len(ops)], observe.OutcomeAcquired)
				e.obs.StoreCall(observe.StoreOps()[(g+i)%len(observe.StoreOps())], time.Microsecond, nil)
			}
		})
	}
	wg.Wait()
	got := collect(t, e.reader)
	var acquired int64
	for _, p := range got["idem.outcomes"].Data.(metricdata.Sum[int64]).DataPoints {
		if v, _ := p.Attributes.Value(idemotel.AttrOutcome); v.AsString() == "acquired" {
			acquired += p.Value
		}
	}
	var calls uint64
	for _, p := range got["db.client.operation.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
		calls += p.Count
	}
	if acquired != goroutines*per || calls != goroutines*per {
		t.Errorf("acquired %d, store calls %d, want %d each", acquired, calls, goroutines*per)
	}
	if n := len(got["idem.outcomes"].Data.(metricdata.Sum[int64]).DataPoints); n != len(ops)*len(observe.Outcomes()) {
		t.Errorf("%d outcome series, want %d", n, len(ops)*len(observe.Outcomes()))
	}
}

// The engine's measurements of its store's clock are recorded in the clock
// gauges: the offset of the last good one, and whether it is trusted.
func TestClockGauges(t *testing.T) {
	e := setup(t, nil)
	if _, ok := collect(t, e.reader)[idemotel.ClockOffsetName]; ok {
		t.Fatal("clock offset recorded before any measurement")
	}
	e.obs.ClockSync(observe.ClockSync{Offset: 300 * time.Second, Trusted: false})
	e.obs.ClockSync(observe.ClockSync{Err: errors.New("store down")})
	off := e.metric(t, idemotel.ClockOffsetName)
	g, ok := off.Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 300 || off.Unit != "s" {
		t.Fatalf("%s: %+v; want one point, 300 s (the failed measurement records none)", idemotel.ClockOffsetName, off)
	}
	trusted := func() int64 {
		t.Helper()
		tg, ok := e.metric(t, idemotel.ClockTrustedName).Data.(metricdata.Gauge[int64])
		if !ok || len(tg.DataPoints) != 1 {
			t.Fatalf("%s: %+v", idemotel.ClockTrustedName, tg)
		}
		return tg.DataPoints[0].Value
	}
	if got := trusted(); got != 0 {
		t.Fatalf("trusted %d, want 0", got)
	}
	e.obs.ClockSync(observe.ClockSync{Offset: time.Millisecond, Trusted: true})
	if got := trusted(); got != 1 {
		t.Fatalf("trusted %d, want 1", got)
	}
}
