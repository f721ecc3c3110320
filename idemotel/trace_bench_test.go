package idemotel_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// What tracing costs a call on memstore: a new call (a claim and a
// complete, three spans) and a replay (a claim, two spans), with no
// Observer, with idemotel's Tracer over the no-op TracerProvider (what the
// Tracer itself costs) and over the SDK, sampling every call into a
// recorder (what a program that records every trace pays).
//
//	cd idemotel && go test -run '^$' -bench BenchmarkTraced -benchmem
func BenchmarkTraced(b *testing.B) {
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, c := range []struct {
		name string
		obs  observe.Observer
	}{
		{"off", nil},
		{"noop", idemotel.MustNewTracer(noop.NewTracerProvider(), nil)},
		{"sdk", idemotel.MustNewTracer(sdk, nil)},
	} {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		b.Cleanup(func() { _ = mem.Close() })
		eng, err := idem.New(mem, &idem.Config{Observer: c.obs})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		op := func(context.Context) ([]byte, error) { return []byte(`{"id":"ch_1"}`), nil }
		b.Run(c.name+"/new", func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				if _, err := idem.Do(ctx, eng, idem.Request{Operation: "charge", Key: fmt.Sprint(c.name, i)}, op); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/replay", func(b *testing.B) {
			req := idem.Request{Operation: "charge", Key: c.name + "1"}
			for b.Loop() {
				if _, err := idem.Do(ctx, eng, req, op); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
