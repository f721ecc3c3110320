package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemprom"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup returns an Observer registered in a registry of its own.
func setup(t *testing.T, cfg *idemprom.Config) (*idemprom.Observer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return obs, reg
}

// value returns the value of the counter, or the count of the histogram,
// named metric with exactly these labels, failing when there is none.
func value(t *testing.T, reg *prometheus.Registry, metric string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s%v", metric, labels)
	return 0
}

func TestObserveCountsByOperationAndOutcome(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	obs.Observe("charge", observe.OutcomeAcquired)
	obs.Observe("charge", observe.OutcomeReplayed)
	obs.Observe("charge", observe.OutcomeReplayed)
	obs.Observe("refund", observe.OutcomeMismatch)
	for _, tc := range []struct {
		operation string
		outcome   observe.Outcome
		want      float64
	}{
		{"charge", observe.OutcomeAcquired, 1},
		{"charge", observe.OutcomeReplayed, 2},
		{"charge", observe.OutcomeUncertain, 0},
		{"refund", observe.OutcomeMismatch, 1},
	} {
		got := value(t, reg, "idem_outcomes_total", map[string]string{"operation": tc.operation, "outcome": tc.outcome.String()})
		if got != tc.want {
			t.Errorf("idem_outcomes_total{operation=%q,outcome=%q} = %v, want %v", tc.operation, tc.outcome, got, tc.want)
		}
	}
}

func TestFirstOutcomeOfAnOperationExportsAllItsOutcomesAtZero(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	if n := testutil.CollectAndCount(obs, "idem_outcomes_total"); n != 0 {
		t.Fatalf("%d outcome series before any call, want 0", n)
	}
	obs.Observe("charge", observe.OutcomeAcquired)
	if n, want := testutil.CollectAndCount(obs, "idem_outcomes_total"), len(observe.Outcomes()); n != want {
		t.Errorf("%d outcome series after the first call, want %d (every outcome)", n, want)
	}
	for _, o := range observe.Outcomes() {
		value(t, reg, "idem_outcomes_total", map[string]string{"operation": "charge", "outcome": o.String()})
	}
}

func TestConfigOperationsAreExportedFromTheStart(t *testing.T) {
	t.Parallel()
	_, reg := setup(t, &idemprom.Config{Operations: []string{"charge", "refund"}})
	for _, op := range []string{"charge", "refund"} {
		for _, o := range observe.Outcomes() {
			if v := value(t, reg, "idem_outcomes_total", map[string]string{"operation": op, "outcome": o.String()}); v != 0 {
				t.Errorf("%s %s = %v before any call", op, o, v)
			}
		}
	}
}

func TestStoreCallObservesLatencyByOpAndResult(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	obs.StoreCall(observe.StoreClaim, 2*time.Millisecond, nil)
	obs.StoreCall(observe.StoreClaim, 3*time.Millisecond, nil)
	obs.StoreCall(observe.StoreComplete, time.Millisecond, &store.FencedError{Key: "k"})
	obs.StoreCall(observe.StoreClaim, time.Second, fmt.Errorf("redisstore: claim k: %w: %w", store.ErrUnavailable, errors.New("i/o timeout")))
	obs.StoreCall(observe.StoreGet, time.Millisecond, store.ErrNotFound)

	for _, tc := range []struct {
		op     observe.StoreOp
		result string
		want   float64
	}{
		{observe.StoreClaim, "ok", 2},
		{observe.StoreComplete, "fenced", 1},
		{observe.StoreClaim, "unavailable", 1},
		{observe.StoreGet, "not_found", 1},
	} {
		got := value(t, reg, "idem_store_call_duration_seconds", map[string]string{"op": string(tc.op), "result": tc.result})
		if got != tc.want {
			t.Errorf("count{op=%q,result=%q} = %v, want %v", tc.op, tc.result, got, tc.want)
		}
	}
	// Only the pairs that occurred are exported.
	if n := testutil.CollectAndCount(obs, "idem_store_call_duration_seconds"); n != 4 {
		t.Errorf("%d store call series, want 4", n)
	}
	// The sum is in seconds.
	want := `
# HELP idem_store_call_duration_seconds Latency of idempotency store calls by operation (claim, complete, fail, release, extend, attach, get) and result (ok or an error class).
# TYPE idem_store_call_duration_seconds histogram
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.0001"} 0
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.00025"} 0
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.0005"} 0
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.001"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.0025"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.005"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.01"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.025"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.05"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.1"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.25"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="0.5"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="1"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="2.5"} 1
idem_store_call_duration_seconds_bucket{op="get",result="not_found",le="+Inf"} 1
idem_store_call_duration_seconds_sum{op="get",result="not_found"} 0.001
idem_store_call_duration_seconds_count{op="get",result="not_found"} 1
`
	only := prometheus.NewRegistry()
	o2, err := idemprom.New(only, nil)
	if err != nil {
		t.Fatal(err)
	}
	o2.StoreCall(observe.StoreGet, time.Millisecond, store.ErrNotFound)
	if err := testutil.GatherAndCompare(only, strings.NewReader(want), "idem_store_call_duration_seconds"); err != nil {
		t.Error(err)
	}
}

// A store operation or outcome this version of idemprom does not know (a
// newer idem) is still counted, under its own label.
func TestUnknownStoreOpAndOutcomeAreCounted(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	obs.StoreCall(observe.StoreOp("scan"), time.Millisecond, nil)
	obs.Observe("charge", observe.Outcome(1000))
	if v := value(t, reg, "idem_store_call_duration_seconds", map[string]string{"op": "scan", "result": "ok"}); v != 1 {
		t.Errorf("scan = %v, want 1", v)
	}
	if v := value(t, reg, "idem_outcomes_total", map[string]string{"operation": "charge", "outcome": "unknown"}); v != 1 {
		t.Errorf("unknown outcome = %v, want 1", v)
	}
}

func TestInvalidUTF8OperationDoesNotPanic(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	obs.Observe("bad\xff", observe.OutcomeAcquired)
	if v := value(t, reg, "idem_outcomes_total", map[string]string{"operation": "bad\uFFFD", "outcome": "acquired"}); v != 1 {
		t.Errorf("= %v, want 1", v)
	}
}

func TestNamespaceAndConstLabels(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, &idemprom.Config{Namespace: "payments", ConstLabels: prometheus.Labels{"store": "redis"}})
	obs.Observe("charge", observe.OutcomeAcquired)
	obs.StoreCall(observe.StoreClaim, time.Millisecond, nil)
	if v := value(t, reg, "payments_idem_outcomes_total", map[string]string{"operation": "charge", "outcome": "acquired", "store": "redis"}); v != 1 {
		t.Errorf("outcomes = %v, want 1", v)
	}
	if v := value(t, reg, "payments_idem_store_call_duration_seconds", map[string]string{"op": "claim", "result": "ok", "store": "redis"}); v != 1 {
		t.Errorf("store calls = %v, want 1", v)
	}
}

// Two Observers in one registry: the same names are refused; the same
// ConstLabels names with other values, or another Namespace, are not.
func TestRegisteringTwice(t *testing.T) {
	t.Parallel()
	t.Run("same names refused", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		if _, err := idemprom.New(reg, nil); err != nil {
			t.Fatal(err)
		}
		_, err := idemprom.New(reg, nil)
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			t.Errorf("second New = %v, want an AlreadyRegisteredError", err)
		}
		if _, err := idemprom.New(reg, &idemprom.Config{Namespace: "other"}); err != nil {
			t.Errorf("New with another Namespace: %v", err)
		}
	})
	t.Run("const label values tell them apart", func(t *testing.T) {
		t.Parallel()
		reg := prometheus.NewRegistry()
		a := idemprom.MustNew(reg, &idemprom.Config{ConstLabels: prometheus.Labels{"engine": "a"}})
		b := idemprom.MustNew(reg, &idemprom.Config{ConstLabels: prometheus.Labels{"engine": "b"}})
		a.Observe("charge", observe.OutcomeAcquired)
		b.Observe("charge", observe.OutcomeReplayed)
		if v := value(t, reg, "idem_outcomes_total", map[string]string{"engine": "b", "operation": "charge", "outcome": "replayed"}); v != 1 {
			t.Errorf("b replayed = %v, want 1", v)
		}
	})
}

func TestMustNewPanicsOnInvalidConfig(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("MustNew did not panic")
		}
	}()
	idemprom.MustNew(nil, &idemprom.Config{Namespace: "1bad"})
}

func TestNilRegistererLeavesRegistrationToTheCaller(t *testing.T) {
	t.Parallel()
	obs := idemprom.MustNew(nil, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(obs)
	obs.Observe("charge", observe.OutcomeAcquired)
	if v := value(t, reg, "idem_outcomes_total", map[string]string{"operation": "charge", "outcome": "acquired"}); v != 1 {
		t.Errorf("= %v, want 1", v)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  idemprom.Config
		want string
	}{
		{"namespace starting with a digit", idemprom.Config{Namespace: "1x"}, "Namespace"},
		{"namespace with a dash", idemprom.Config{Namespace: "my-app"}, "Namespace"},
		{"namespace with a colon", idemprom.Config{Namespace: "a:b"}, "Namespace"},
		{"const label with a dash", idemprom.Config{ConstLabels: prometheus.Labels{"a-b": "x"}}, "ConstLabels"},
		{"reserved const label", idemprom.Config{ConstLabels: prometheus.Labels{"__name": "x"}}, "ConstLabels"},
		{"const label clashing with operation", idemprom.Config{ConstLabels: prometheus.Labels{"operation": "x"}}, "idemprom's own"},
		{"const label clashing with result", idemprom.Config{ConstLabels: prometheus.Labels{"result": "x"}}, "idemprom's own"},
		{"const label value not UTF-8", idemprom.Config{ConstLabels: prometheus.Labels{"a": "\xff"}}, "UTF-8"},
		{"empty buckets", idemprom.Config{Buckets: []float64{}}, "Buckets is empty"},
		{"decreasing buckets", idemprom.Config{Buckets: []float64{1, 0.5}}, "Buckets must increase"},
		{"invalid operation", idemprom.Config{Operations: []string{"has space"}}, "Operations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemprom.New(nil, &tc.cfg)
			if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want idem.ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := idemprom.New(nil, &idemprom.Config{Namespace: "payments_v2", ConstLabels: prometheus.Labels{"store": "redis"}, Buckets: []float64{0.1, 1}}); err != nil {
		t.Errorf("valid Config refused: %v", err)
	}
}

// The Observer through an engine: what a user of idem.Do sees.
func TestThroughTheEngine(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	mem := memstore.New(nil)
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := idem.Request{Operation: "charge", Key: "k1", Payload: []byte(`{"amount":1}`)}
	for range 2 {
		if _, err := idem.Do(ctx, eng, req, func(context.Context) (string, error) { return "ok", nil }); err != nil {
			t.Fatal(err)
		}
	}
	if v := value(t, reg, "idem_outcomes_total", map[string]string{"operation": "charge", "outcome": "acquired"}); v != 1 {
		t.Errorf("acquired = %v, want 1", v)
	}
	if v := value(t, reg, "idem_store_call_duration_seconds", map[string]string{"op": "claim", "result": "ok"}); v < 1 {
		t.Errorf("claims = %v, want at least 1", v)
	}
	if v := value(t, reg, "idem_store_call_duration_seconds", map[string]string{"op": "complete", "result": "ok"}); v != 1 {
		t.Errorf("completes = %v, want 1", v)
	}
}

// Concurrent first sights of operations and (op, result) pairs: every
// count lands once, whichever goroutine made the series (run with -race,
// -count=50).
func TestConcurrentFirstSight(t *testing.T) {
	t.Parallel()
	obs, reg := setup(t, nil)
	const goroutines, per = 8, 50
	ops := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				obs.Observe(ops[(g+i)%len(ops)], observe.OutcomeAcquired)
				obs.StoreCall(observe.StoreOps()[(g+i)%len(observe.StoreOps())], time.Microsecond, nil)
			}
		})
	}
	wg.Wait()
	var total float64
	for _, op := range ops {
		total += value(t, reg, "idem_outcomes_total", map[string]string{"operation": op, "outcome": "acquired"})
	}
	if total != goroutines*per {
		t.Errorf("acquired in total = %v, want %d", total, goroutines*per)
	}
	total = 0
	for _, op := range observe.StoreOps() {
		total += value(t, reg, "idem_store_call_duration_seconds", map[string]string{"op": string(op), "result": "ok"})
	}
	if total != goroutines*per {
		t.Errorf("store calls in total = %v, want %d", total, goroutines*per)
	}
}

// fakeServerClock is a memstore that tells a clock of its own, ahead of
// the process's by off: a fake of a server's clock (store.ServerTimer).
type fakeServerClock struct {
	*memstore.Store
	off time.Duration
}

func (s fakeServerClock) ServerTime(context.Context) (time.Time, error) {
	return time.Now().Add(s.off), nil
}

// The engine's measurement of its store's clock is exported as
// idem_clock_offset_seconds and idem_clock_trusted, from the first one on;
// an engine whose store is not measured exports neither.
func TestClockGauges(t *testing.T) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	reg := prometheus.NewPedanticRegistry()
	o := idemprom.MustNew(reg, nil)
	e, err := idem.New(mem, &idem.Config{Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: "k"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "idem_clock_offset_seconds", "idem_clock_trusted"); err != nil || n != 0 {
		t.Fatalf("memstore engine exports %d clock series (%v), want none", n, err)
	}

	far := fakeServerClock{Store: mem, off: 5 * time.Minute}
	e, err = idem.New(far, &idem.Config{Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: "k2"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "idem_clock_offset_seconds"); got < 299 || got > 301 {
		t.Fatalf("idem_clock_offset_seconds = %v, want 300", got)
	}
	want := `
# HELP idem_clock_trusted 1 when the engine's offset to the store's clock is known, fresh and within idem.Config.MaxClockOffset; 0 while it takes no claim over.
# TYPE idem_clock_trusted gauge
idem_clock_trusted 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_clock_trusted"); err != nil {
		t.Fatal(err)
	}
	o.ClockSync(observe.ClockSync{Err: errors.New("store down")})
	if got := gauge(t, reg, "idem_clock_offset_seconds"); got < 299 || got > 301 {
		t.Fatalf("after a failed measurement idem_clock_offset_seconds = %v, want the last good one, 300", got)
	}
	o.ClockSync(observe.ClockSync{Offset: -2 * time.Millisecond, Trusted: true})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(strings.Replace(want, "trusted 0", "trusted 1", 1)), "idem_clock_trusted"); err != nil {
		t.Fatal(err)
	}
}

// gauge returns the value of the unlabelled gauge named metric.
func gauge(t *testing.T, reg prometheus.Gatherer, metric string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == metric && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", metric)
	return 0
}
