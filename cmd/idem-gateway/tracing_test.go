package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/seed-a1b882c0/idem/store/memstore"
)

// tracedUpstream is an upstream that records the traceparent of every
// request it gets.
type tracedUpstream struct {
	srv     *httptest.Server
	mu      sync.Mutex
	parents []string
}

func newTracedUpstream(t *testing.T) *tracedUpstream {
	u := &tracedUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.parents = append(u.parents, r.Header.Get("Traceparent"))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1"}`)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *tracedUpstream) got() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.parents)
}

// A covered request is a server span continuing the client's trace, with
// the idem attributes; the engine's span of its key, its store calls and
// the upstream request are its children, and the upstream gets the trace
// (traceparent of the gateway's client span). A replay (from the
// gateway's cache) is a server span marked replayed, and reaches no
// upstream.
func TestGatewayRequestIsTraced(t *testing.T) {
	t.Parallel()
	up := newTracedUpstream(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	o, err := parseFlags([]string{"-upstream", up.srv.URL, "-store", "memory:"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.tracing = newTracingWith(tp)
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	g, err := newGateway(o, mem, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	gw := httptest.NewServer(g.handler)
	t.Cleanup(gw.Close)

	// The client's own span, sent as traceparent.
	clientCtx, client := tp.Tracer("client").Start(context.Background(), "client")
	client.End()
	post := func() *http.Response {
		req, err := http.NewRequestWithContext(clientCtx, "POST", gw.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "order-secret-1")
		propagation.TraceContext{}.Inject(clientCtx, propagation.HeaderCarrier(req.Header))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := post(); resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp := post(); resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: status %d, headers %v", resp.StatusCode, resp.Header)
	}
	// The server spans end after the response is written: wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for countNamed(exp.GetSpans(), "POST", trace.SpanKindServer) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	spans := exp.GetSpans()
	tree := spanTree(spans)
	want := `client
  POST (server)
    idem.do gateway
      claim (client)
      POST (client)
      complete (client)
  POST (server)
    idem.do gateway
`
	if tree != want {
		t.Fatalf("span tree:\n%s\nwant:\n%s", tree, want)
	}
	var servers, upstreamCalls []tracetest.SpanStub
	for _, s := range spans {
		switch {
		case s.Name == "POST" && s.SpanKind == trace.SpanKindServer:
			servers = append(servers, s)
		case s.Name == "POST" && s.SpanKind == trace.SpanKindClient:
			upstreamCalls = append(upstreamCalls, s)
		}
	}
	slices.SortFunc(servers, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for i, wantReplayed := range []string{"false", "true"} {
		a := map[attribute.Key]string{}
		for _, kv := range servers[i].Attributes {
			a[kv.Key] = kv.Value.String()
		}
		wantOutcome := map[string]string{"false": "acquired", "true": "cache_hit"}[wantReplayed]
		if a["idem.operation"] != "gateway" || a["idem.replayed"] != wantReplayed || a["idem.outcome"] != wantOutcome ||
			len(a["idem.key.hash"]) != 32 || a["http.response.status_code"] != "201" {
			t.Errorf("server span %d: %v", i, a)
		}
		if servers[i].SpanContext.TraceID() != client.SpanContext().TraceID() {
			t.Errorf("server span %d is not in the client's trace", i)
		}
	}
	// The upstream got the trace: the gateway's client span as parent.
	if got := up.got(); len(got) != 1 || len(upstreamCalls) != 1 ||
		got[0] != "00-"+client.SpanContext().TraceID().String()+"-"+upstreamCalls[0].SpanContext.SpanID().String()+"-01" {
		t.Fatalf("upstream got traceparents %q; the gateway's upstream span is %s", got, upstreamCalls[0].SpanContext.SpanID())
	}
	for _, s := range spans {
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), "order-secret-1") {
				t.Errorf("span %s carries the raw key in %s", s.Name, kv.Key)
			}
		}
	}
}

func countNamed(spans tracetest.SpanStubs, name string, kind trace.SpanKind) int {
	n := 0
	for _, s := range spans {
		if s.Name == name && s.SpanKind == kind {
			n++
		}
	}
	return n
}

// spanTree draws spans as an indented tree, children in the order they
// started, with their kind when it is not internal.
func spanTree(spans tracetest.SpanStubs) string {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if s.Parent.IsValid() && ids[s.Parent.SpanID()] {
			children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) }
	var b strings.Builder
	var draw func(s tracetest.SpanStub, depth int)
	draw = func(s tracetest.SpanStub, depth int) {
		b.WriteString(strings.Repeat("  ", depth) + s.Name)
		if s.SpanKind != trace.SpanKindInternal {
			b.WriteString(" (" + s.SpanKind.String() + ")")
		}
		b.WriteString("\n")
		kids := children[s.SpanContext.SpanID()]
		slices.SortStableFunc(kids, byStart)
		for _, k := range kids {
			draw(k, depth+1)
		}
	}
	slices.SortStableFunc(roots, byStart)
	for _, r := range roots {
		draw(r, 0)
	}
	return b.String()
}

// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter; a value
// the gateway cannot serve is a startup error.
func TestTracingConfigFromTheEnvironment(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env     map[string]string
		on      bool
		errLike string
	}{
		{env: nil},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, errLike: "want otlp, console or none"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, errLike: "http/protobuf only"},
	} {
		tr, stop, err := newTracing(context.Background(), func(k string) string { return c.env[k] }, io.Discard)
		switch {
		case c.errLike != "":
			if err == nil || !strings.Contains(err.Error(), c.errLike) {
				t.Errorf("%v: %v, want an error saying %q", c.env, err, c.errLike)
			}
		case err != nil:
			t.Errorf("%v: %v", c.env, err)
		case (tr != nil) != c.on:
			t.Errorf("%v: tracing %v, want %v", c.env, tr != nil, c.on)
		}
		if stop != nil {
			_ = stop(context.Background())
		}
	}
}

// With OTEL_TRACES_EXPORTER=otlp the gateway process exports its spans
// over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT, with the service name of
// OTEL_SERVICE_NAME; here a collector in the test decodes them.
func TestGatewayExportsOTLPFromTheEnvironment(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var exported []*collectortrace.ExportTraceServiceRequest
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		exported = append(exported, &req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write([]byte{})
	}))
	t.Cleanup(collector.Close)
	up := newTracedUpstream(t)
	p := startGatewayEnv(t, []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_SERVICE_NAME=orders-gateway", "OTEL_BSP_SCHEDULE_DELAY=50"},
		"-upstream", up.srv.URL, "-store", "memory:")
	req, _ := http.NewRequest("POST", "http://"+p.addr+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := up.got(); len(got) != 1 || got[0] == "" {
		t.Fatalf("upstream got traceparents %q", got)
	}
	// SIGTERM: the gateway stops and flushes its spans.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("gateway exited with %v:\n%s", err, p.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("gateway did not stop within 30s:\n%s", p.logs)
	}
	mu.Lock()
	defer mu.Unlock()
	names := map[string]bool{}
	service := ""
	for _, req := range exported {
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					service = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names[s.Name] = true
				}
			}
		}
	}
	for _, n := range []string{"POST", "idem.do gateway", "claim", "complete"} {
		if !names[n] {
			t.Errorf("no span %q exported; got %v\n%s", n, names, p.logs)
		}
	}
	if service != "orders-gateway" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", service)
	}
}

// In asynchronous mode the worker settles the key through the admin
// listener with the request's Idem-Token: that is a server span too, and
// the engine's write through the token is linked to the span of the
// request that began the work.
func TestGatewayTokenWriteIsLinkedToTheRequest(t *testing.T) {
	t.Parallel()
	up := newAsyncUpstream(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	o, err := parseFlags([]string{"-upstream", up.srv.URL, "-store", "memory:", "-admin", "127.0.0.1:0", "-status-path", statusPath}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.tracing = newTracingWith(tp)
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	g, err := newGateway(o, mem, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	gw, admin := httptest.NewServer(g.handler), httptest.NewServer(g.adminHandler())
	t.Cleanup(gw.Close)
	t.Cleanup(admin.Close)

	req, _ := http.NewRequest("POST", gw.URL+"/transfers", strings.NewReader(`{"amount":5}`))
	req.Header.Set("Idempotency-Key", "transfer-secret-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tok := up.job(t)
	resp, err = http.Post(admin.URL+"/idem/v1/tokens/"+tok+"/complete?status=201", "application/json", strings.NewReader(`{"done":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("complete: status %d", resp.StatusCode)
	}
	deadline := time.Now().Add(10 * time.Second)
	for countNamed(exp.GetSpans(), "POST", trace.SpanKindServer) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	spans := exp.GetSpans()
	var began, complete tracetest.SpanStub
	for _, s := range spans {
		switch s.Name {
		case "idem.do gateway":
			began = s
		case "idem.complete gateway":
			complete = s
		}
	}
	if len(complete.Links) != 1 || complete.Links[0].SpanContext.SpanID() != began.SpanContext.SpanID() {
		t.Fatalf("the token's complete is linked to %+v, want the request's span %s:\n%s", complete.Links, began.SpanContext.SpanID(), spanTree(spans))
	}
	if p := complete.Parent; !p.IsValid() || countNamed(spans, "POST", trace.SpanKindServer) != 2 {
		t.Fatalf("the token's complete is not under the admin request's server span:\n%s", spanTree(spans))
	}
}
