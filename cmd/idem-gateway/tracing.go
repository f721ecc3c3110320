package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/observe"
)

// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter; the rest
// of the configuration is the OpenTelemetry SDK's own environment
// variables, read by the SDK and the exporter themselves:
//
//	OTEL_TRACES_EXPORTER          otlp (OTLP over HTTP/protobuf), console (JSON on standard output) or none
//	OTEL_EXPORTER_OTLP_ENDPOINT   e.g. http://127.0.0.1:4318 (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, the full URL);
//	                              OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE likewise
//	OTEL_EXPORTER_OTLP_PROTOCOL   http/protobuf only (the default)
//	OTEL_SERVICE_NAME             default idem-gateway; OTEL_RESOURCE_ATTRIBUTES adds attributes
//	OTEL_TRACES_SAMPLER(_ARG)     the sampler (default parentbased_always_on)
//	OTEL_BSP_*                    the batch span processor's queue and delays
//	OTEL_SDK_DISABLED=true        off, whatever else is set
const (
	envTracesExporter = "OTEL_TRACES_EXPORTER"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// tracing is the gateway's tracer provider and propagator, when tracing
// is on.
type tracing struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// newTracing reads the OTEL_* environment (getenv) and returns the
// tracing it asks for, with the function that flushes and stops it; nil
// when tracing is off. console is where the console exporter writes.
func newTracing(ctx context.Context, getenv func(string) string, console io.Writer) (*tracing, func(context.Context) error, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(envSDKDisabled)), "true") {
		return nil, nil, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch name := strings.TrimSpace(getenv(envTracesExporter)); name {
	case "", "none":
		return nil, nil, nil
	case "otlp":
		proto := getenv(envTracesProtocol)
		if proto == "" {
			proto = getenv(envProtocol)
		}
		if proto != "" && proto != "http/protobuf" {
			return nil, nil, fmt.Errorf("%s=%s: the gateway exports OTLP over http/protobuf only", envProtocol, proto)
		}
		exp, err = otlptracehttp.New(ctx)
	case "console":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(console))
	default:
		return nil, nil, fmt.Errorf("%s=%q: want otlp, console or none", envTracesExporter, name)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", envTracesExporter, err)
	}
	// service.name is idem-gateway unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES say otherwise (WithFromEnv comes last).
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("idem-gateway")),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return newTracingWith(tp), tp.Shutdown, nil
}

// newTracingWith is tracing over tp, with W3C Trace Context and Baggage
// propagation.
func newTracingWith(tp trace.TracerProvider) *tracing {
	return &tracing{tp: tp, prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
}

// server wraps h, the public listener's handler, in a server span per
// request, continuing the client's trace (traceparent); the engine's
// span of the request's key is its child and sets the idem attributes on
// it (idemotel.TracerConfig.AnnotateParent).
func (t *tracing) server(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, "idem-gateway",
		otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(t.prop),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// transport wraps the proxy's transport in a client span per upstream
// request, which sends the trace on upstream (traceparent, tracestate,
// baggage).
func (t *tracing) transport(rt http.RoundTripper) http.RoundTripper {
	if t == nil {
		return rt
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(t.prop),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// observer is the engine's observer: the metrics, traced when tracing is
// on.
func (t *tracing) observer(metrics observe.Observer) observe.Observer {
	if t == nil {
		return metrics
	}
	return idemotel.MustNewTracer(t.tp, &idemotel.TracerConfig{Observer: metrics, AnnotateParent: true})
}
