package idemotel_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func ExampleNew() {
	// In a program: idemotel.MustNew(otel.Meter("payments"), nil), with
	// the application's MeterProvider set globally. Here an SDK provider
	// read by hand.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs := idemotel.MustNew(mp.Meter("payments"), nil)

	mem := memstore.New(nil)
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Observer: obs})
	if err != nil {
		panic(err)
	}
	req := idem.Request{Operation: "charge", Key: "order-42", Payload: []byte(`{"amount":100}`)}
	if _, err := idem.Do(context.Background(), eng, req, func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
		panic(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range data.DataPoints {
				if p.Value > 0 {
					fmt.Println(m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
				}
			}
		case metricdata.Histogram[float64]:
			for _, p := range data.DataPoints {
				fmt.Println(m.Name, m.Unit, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Count)
			}
		}
	}
	// Unordered output:
	// idem.outcomes operation=charge,outcome=acquired 1
	// db.client.operation.duration s db.operation.name=claim,db.system.name=idem 1
	// db.client.operation.duration s db.operation.name=complete,db.system.name=idem 1
}

func ExampleNewTracer() {
	// In a program: idemotel.MustNewTracer(nil, ...), with the
	// application's TracerProvider set globally. Here an SDK provider
	// whose spans are recorded in memory.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tracer := idemotel.MustNewTracer(tp, &idemotel.TracerConfig{
		Observer: idemotel.MustNew(nil, nil), // metrics as well, from the global MeterProvider
	})

	mem := memstore.New(nil)
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Observer: tracer})
	if err != nil {
		panic(err)
	}
	req := idem.Request{Operation: "charge", Key: "order-42", Payload: []byte(`{"amount":100}`)}
	if _, err := idem.Do(context.Background(), eng, req, func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
		panic(err)
	}
	for _, s := range rec.Ended() {
		var kv []string
		for _, a := range s.Attributes() {
			switch a.Key {
			case "idem.outcome", "idem.fence", "db.system.name", "db.operation.name":
				kv = append(kv, string(a.Key)+"="+a.Value.String())
			}
		}
		fmt.Println(s.Name(), s.SpanKind(), kv)
	}
	// Output:
	// claim client [db.system.name=memory db.operation.name=claim]
	// complete client [db.system.name=memory db.operation.name=complete]
	// idem.do charge internal [idem.outcome=acquired idem.fence=1]
}
