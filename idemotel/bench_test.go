package idemotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// meters are the Meters the benchmarks run against: the SDK (what a
// program pays) and the no-op API (what idemotel itself costs).
func meters(b *testing.B) map[string]metric.Meter {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return map[string]metric.Meter{"sdk": mp.Meter("bench"), "noop": noop.NewMeterProvider().Meter("bench")}
}

// The Observer's hot path: an operation already seen, a store call of a
// known op. idemotel allocates nothing there.
//
//	cd idemotel && go test -run '^$' -bench . -benchmem
func BenchmarkObserve(b *testing.B) {
	for _, name := range []string{"sdk", "noop"} {
		obs := idemotel.MustNew(meters(b)[name], &idemotel.Config{Operations: []string{"charge", "refund", "payout"}})
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				obs.Observe("refund", observe.OutcomeReplayed)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					obs.Observe("refund", observe.OutcomeReplayed)
				}
			})
		})
	}
}

func BenchmarkStoreCall(b *testing.B) {
	fenced := fmt.Errorf("complete: %w", &store.FencedError{Key: "k"})
	for _, name := range []string{"sdk", "noop"} {
		obs := idemotel.MustNew(meters(b)[name], nil)
		for _, bc := range []struct {
			name string
			err  error
		}{{"ok", nil}, {"fenced", fenced}} {
			b.Run(name+"/"+bc.name, func(b *testing.B) {
				for b.Loop() {
					obs.StoreCall(observe.StoreComplete, 1500*time.Microsecond, bc.err)
				}
			})
		}
	}
}

// BenchmarkWithAttributes is the plain API way, attributes built per call,
// for comparison.
func BenchmarkWithAttributes(b *testing.B) {
	h, err := meters(b)["sdk"].Float64Histogram("h")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		h.Record(context.Background(), 0.0015, metric.WithAttributes(
			attribute.String("db.system.name", "idem"), attribute.String("db.operation.name", "complete")))
	}
}
