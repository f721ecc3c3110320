package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemotel"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// traced is a TracerProvider whose spans end up in an in-memory exporter,
// and an idemotel Tracer over it.
type traced struct {
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	tracer *idemotel.Tracer
	obs    *observe.Counters // the metrics the Tracer passes on to
}

func newTraced(t *testing.T, cfg *idemotel.TracerConfig) *traced {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := &traced{exp: exp, tp: tp, obs: &observe.Counters{}}
	if cfg == nil {
		cfg = &idemotel.TracerConfig{}
	}
	cfg.Observer = tr.obs
	var err error
	if tr.tracer, err = idemotel.NewTracer(tp, cfg); err != nil {
		t.Fatal(err)
	}
	return tr
}

// engine returns an engine over s traced by tr.
func (tr *traced) engine(t *testing.T, s store.Store, cfg idem.Config) *idem.Engine {
	t.Helper()
	cfg.Observer = tr.tracer
	e, err := idem.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func newMem(t *testing.T) *memstore.Store {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	return mem
}

// take returns the spans ended so far and forgets them.
func (tr *traced) take() tracetest.SpanStubs {
	s := tr.exp.GetSpans()
	tr.exp.Reset()
	return s
}

// tree draws the spans as an indented tree, children in the order they
// started, each root's and child's name followed by its kind when it is
// not internal.
func tree(spans tracetest.SpanStubs) string {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			children[p] = append(children[p], s)
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

func named(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q in\n%s", name, tree(spans))
	return tracetest.SpanStub{}
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// wantAttrs checks that every attribute of want is in got, with its value;
// an empty value wants it absent.
func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]string) {
	t.Helper()
	have := attrs(got)
	for k, v := range want {
		if hv, ok := have[k]; v == "" && ok {
			t.Errorf("%s: %s=%q, want none", what, k, hv)
		} else if v != "" && hv != v {
			t.Errorf("%s: %s=%q, want %q (all: %v)", what, k, hv, v, have)
		}
	}
}

// noSecrets fails when any span, attribute or event carries one of the
// secrets: raw keys, payloads, store keys.
func noSecrets(t *testing.T, spans tracetest.SpanStubs, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Name, s.Status.Description}
		for _, kv := range s.Attributes {
			texts = append(texts, kv.Value.String())
		}
		for _, ev := range s.Events {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, kv.Value.String())
			}
		}
		for _, text := range texts {
			for _, secret := range secrets {
				if strings.Contains(text, secret) {
					t.Errorf("span %s carries %q: %q", s.Name, secret, text)
				}
			}
		}
	}
}

func charge(key string) idem.Request {
	return idem.Request{Operation: "charge", Key: key, Payload: []byte(`{"amount":100,"card":"4242"}`)}
}

// A new call is a span under the caller's, with a client span per store
// call (claim, complete) and the operation's own spans as children; its
// replay is a span with the claim alone, marked replayed.
func TestTraceOfANewCallAndItsReplay(t *testing.T) {
	t.Parallel()
	tr := newTraced(t, nil)
	eng := tr.engine(t, newMem(t), idem.Config{})
	ctx, req := tr.tp.Tracer("test").Start(context.Background(), "request")
	work := func(ctx context.Context) (string, error) {
		_, s := tr.tp.Tracer("test").Start(ctx, "work")
		s.End()
		return "ch_1", nil
	}
	res, err := idem.Do(ctx, eng, charge("order-1"), work)
	if err != nil || res.Replayed {
		t.Fatalf("%+v %v", res, err)
	}
	again, err := idem.Do(ctx, eng, charge("order-1"), work)
	if err != nil || !again.Replayed {
		t.Fatalf("%+v %v", again, err)
	}
	req.End()
	spans := tr.take()
	want := `request
  idem.do charge
    claim (client)
    work
    complete (client)
  idem.do charge
    claim (client)
`
	if got := tree(spans); got != want {
		t.Fatalf("span tree:\n%s\nwant:\n%s", got, want)
	}
	first, replay := spans[3], spans[5] // in the order they ended
	hash := idemotel.KeyHash(res.StoreKey)
	wantAttrs(t, "new call", first.Attributes, map[attribute.Key]string{
		"idem.operation": "charge", "idem.key.hash": hash, "idem.call": "do",
		"idem.outcome": "acquired", "idem.replayed": "false", "idem.fence": "1", "error.type": "",
	})
	wantAttrs(t, "replay", replay.Attributes, map[attribute.Key]string{
		"idem.operation": "charge", "idem.key.hash": hash,
		"idem.outcome": "replayed", "idem.replayed": "true", "idem.fence": "",
	})
	for _, s := range spans {
		if s.Name == "claim" || s.Name == "complete" {
			wantAttrs(t, s.Name, s.Attributes, map[attribute.Key]string{
				"db.system.name": "memory", "db.operation.name": s.Name, "error.type": "",
			})
		}
		if s.Status.Code == codes.Error {
			t.Errorf("span %s: status %v", s.Name, s.Status)
		}
	}
	noSecrets(t, spans, "order-1", "4242", res.StoreKey)
	// The metrics go on: the Tracer passed every outcome to its Observer.
	if tr.obs.Count(observe.OutcomeAcquired) != 1 || tr.obs.Count(observe.OutcomeReplayed) != 1 {
		t.Errorf("outcomes passed on: %v", tr.obs.Snapshot())
	}
}

// A replay from the local cache makes no store call: its span has no
// child.
func TestTraceOfACacheHit(t *testing.T) {
	t.Parallel()
	tr := newTraced(t, nil)
	eng := tr.engine(t, newMem(t), idem.Config{CacheEntries: 10})
	req := idem.Request{Operation: "charge", Key: "order-2"} // no payload: the cache's fast path
	for range 2 {
		if _, err := idem.Do(context.Background(), eng, req, func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
	}
	spans := tr.take()
	if got, want := tree(spans), "idem.do charge\n  claim (client)\n  complete (client)\nidem.do charge\n"; got != want {
		t.Fatalf("span tree:\n%s\nwant:\n%s", got, want)
	}
	wantAttrs(t, "cache hit", spans[len(spans)-1].Attributes, map[attribute.Key]string{"idem.outcome": "cache_hit", "idem.replayed": "true"})
}

// Errors are recorded with their typed kind, and their message without
// the store key.
func TestTraceRecordsErrorsByKind(t *testing.T) {
	t.Parallel()
	tr := newTraced(t, nil)
	eng := tr.engine(t, newMem(t), idem.Config{})
	ctx := context.Background()
	first, err := idem.Do(ctx, eng, charge("order-3"), func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	other := charge("order-3")
	other.Payload = []byte(`{"amount":200}`)
	_, err = idem.Do(ctx, eng, other, func(context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, idem.ErrMismatch) {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, eng, charge("order-4"), func(context.Context) (int, error) {
		return 0, &idem.TerminalError{Code: "card_declined", Message: "declined"}
	})
	if !errors.Is(err, idem.ErrTerminal) {
		t.Fatal(err)
	}
	_, err = idem.Do(ctx, eng, charge("order-5"), func(context.Context) (int, error) { return 0, errors.New("try later") })
	if err == nil {
		t.Fatal("no error")
	}
	spans := tr.take()
	var calls []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "idem.do charge" {
			calls = append(calls, s)
		}
	}
	for i, want := range []map[attribute.Key]string{
		{"error.type": "", "idem.outcome": "acquired"},
		{"error.type": "mismatch", "idem.outcome": "mismatch"},
		{"error.type": "terminal", "idem.outcome": "failed", "idem.fence": "1"},
		{"error.type": "_OTHER", "idem.outcome": "released", "idem.fence": "1"},
	} {
		wantAttrs(t, fmt.Sprint("call ", i), calls[i].Attributes, want)
		if (want["error.type"] != "") != (calls[i].Status.Code == codes.Error) {
			t.Errorf("call %d: status %v", i, calls[i].Status)
		}
	}
	if !strings.Contains(calls[1].Status.Description, "key:"+idemotel.KeyHash(first.StoreKey)) {
		t.Errorf("mismatch message %q does not name the key by its hash", calls[1].Status.Description)
	}
	noSecrets(t, spans, "order-3", "4242", `"amount":200`, first.StoreKey)
}

// A claim whose lease lapsed is taken over by another engine: the new
// call's span has a takeover event, and the old holder's span the failed
// renewals, the lost lease and the refused outcome write. Time is fake
// (synctest); the renewals run on the engine's own timer.
func TestTraceOfATakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTraced(t, nil)
		mem := newMem(t)
		faulty := faultstore.New(mem)
		cfg := idem.Config{Clock: store.SystemClock{}, Lease: 3 * time.Second, RenewInterval: time.Second}
		a := tr.engine(t, faulty, cfg)
		b := tr.engine(t, mem, cfg)
		ctx := context.Background()
		// A's renewals fail while the store is cut off from it.
		faulty.FailAlways("extend", fmt.Errorf("cut off: %w", store.ErrUnavailable))
		inside := make(chan struct{})
		done := make(chan error)
		go func() {
			_, err := idem.Do(ctx, a, charge("order-6"), func(ctx context.Context) (int, error) {
				close(inside)
				<-ctx.Done()
				return 0, context.Cause(ctx)
			})
			done <- err
		}()
		<-inside
		time.Sleep(4 * time.Second) // past A's lease
		res, err := idem.Do(ctx, b, charge("order-6"), func(context.Context) (int, error) { return 2, nil })
		if err != nil || res.Fence != 2 {
			t.Fatalf("takeover: %+v %v", res, err)
		}
		faulty.FailAlways("extend", nil) // A reaches the store again
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("A: %v, want ErrLeaseLost", err)
		}
		spans := tr.take()
		var aSpan, bSpan tracetest.SpanStub
		for _, s := range spans {
			if s.Name != "idem.do charge" {
				continue
			}
			if attrs(s.Attributes)["idem.fence"] == "2" {
				bSpan = s
			} else {
				aSpan = s
			}
		}
		events := func(s tracetest.SpanStub) []string {
			var out []string
			for _, ev := range s.Events {
				e := ev.Name
				if et := attrs(ev.Attributes)["error.type"]; et != "" {
					e += " " + et
				}
				if f := attrs(ev.Attributes)["idem.fence"]; f != "" {
					e += " fence=" + f
				}
				out = append(out, e)
			}
			return slices.Compact(out)
		}
		if got, want := events(bSpan), []string{"idem.takeover fence=2"}; !slices.Equal(got, want) {
			t.Errorf("B's events %q, want %q", got, want)
		}
		wantAttrs(t, "B", bSpan.Attributes, map[attribute.Key]string{"idem.outcome": "acquired", "idem.fence": "2", "error.type": ""})
		if got, want := events(aSpan), []string{"idem.lease.renew store_unavailable", "idem.lease.lost store_fenced fence=1"}; !slices.Equal(got, want) {
			t.Errorf("A's events %q, want %q", got, want)
		}
		wantAttrs(t, "A", aSpan.Attributes, map[attribute.Key]string{"idem.outcome": "fenced", "idem.fence": "1", "error.type": "lease_lost"})
		// A's renewals are its own client spans: the failed ones say why.
		var failed int
		for _, s := range spans {
			if s.Parent.SpanID() == aSpan.SpanContext.SpanID() && s.Name == "extend" && attrs(s.Attributes)["error.type"] == "unavailable" {
				failed++
				wantAttrs(t, "A's extend", s.Attributes, map[attribute.Key]string{"db.system.name": "idem"}) // the fault store names no backend
			}
		}
		if failed == 0 {
			t.Errorf("no failed extend span under A:\n%s", tree(spans))
		}
		noSecrets(t, spans, "order-6", "4242")
	})
}

// Work handed off with a token keeps its trace: the token carries the
// trace context of the call that began the work, and the span of the
// Complete in another engine (another process, another trace) is linked
// to it — for a token from Begin and one from Detach, signed or not.
func TestTokenCompletionInAnotherEngineIsLinked(t *testing.T) {
	t.Parallel()
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			t.Parallel()
			starter, worker := newTraced(t, nil), newTraced(t, nil)
			mem := newMem(t)
			cfg := idem.Config{}
			if signed {
				cfg.TokenKey = []byte("0123456789abcdef-trace-test")
			}
			a, b := starter.engine(t, mem, cfg), worker.engine(t, mem, cfg)
			ctx := context.Background()

			begun, err := a.Begin(ctx, charge("order-7"), nil)
			if err != nil || !begun.Acquired {
				t.Fatalf("%+v %v", begun, err)
			}
			var detached string
			if _, err := idem.Do(ctx, a, charge("order-8"), func(ctx context.Context) (int, error) {
				tok, err := idem.Detach(ctx, time.Minute, "job-8")
				detached = tok.String()
				return 0, err
			}); err != nil {
				t.Fatal(err)
			}
			began := starter.take()
			for i, s := range []string{begun.Token.String(), detached} {
				tok, err := idem.ParseToken(s, "charge") // as a worker reads it
				if err != nil {
					t.Fatal(err)
				}
				origin := began[len(began)-1]
				if i == 0 {
					origin = named(t, began, "idem.begin charge")
				}
				if tok.TraceParent() == "" || !strings.Contains(tok.TraceParent(), origin.SpanContext.SpanID().String()) {
					t.Fatalf("token %d carries trace %q, want the span %s", i, tok.TraceParent(), origin.SpanContext.SpanID())
				}
				if err := b.Complete(ctx, tok, 42); err != nil {
					t.Fatal(err)
				}
				spans := worker.take()
				if got, want := tree(spans), "idem.complete charge\n  complete (client)\n"; got != want {
					t.Fatalf("worker's spans:\n%s\nwant:\n%s", got, want)
				}
				c := spans[len(spans)-1]
				if len(c.Links) != 1 || c.Links[0].SpanContext.SpanID() != origin.SpanContext.SpanID() ||
					c.Links[0].SpanContext.TraceID() != origin.SpanContext.TraceID() {
					t.Fatalf("complete's links %+v, want the span that began the work %s", c.Links, origin.SpanContext.SpanID())
				}
				if c.SpanContext.TraceID() == origin.SpanContext.TraceID() {
					t.Errorf("the worker's complete joined the starter's trace; it is linked, in a trace of its own")
				}
				wantAttrs(t, "complete", c.Attributes, map[attribute.Key]string{"idem.call": "complete", "idem.fence": "1", "error.type": ""})
			}
			// A second Complete through the spent token is refused, and
			// its span says so.
			if err := b.Complete(ctx, begun.Token, 43); !errors.Is(err, idem.ErrStaleToken) {
				t.Fatalf("%v, want ErrStaleToken", err)
			}
			wantAttrs(t, "stale", named(t, worker.take(), "idem.complete charge").Attributes, map[attribute.Key]string{"error.type": "stale_token"})
		})
	}
}

// DoBatch is a span with the batch claim and each key's call as children.
func TestTraceOfABatch(t *testing.T) {
	t.Parallel()
	tr := newTraced(t, nil)
	eng := tr.engine(t, newMem(t), idem.Config{})
	ids := make([]idem.Identity, 2)
	for i := range ids {
		r := charge(fmt.Sprint("order-b", i))
		id, err := r.Identity()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	_, errs := idem.DoBatch(context.Background(), eng, ids, &idem.BatchOptions[int]{Concurrency: 1}, func(ctx context.Context, i int) (int, error) {
		_, s := tr.tp.Tracer("test").Start(ctx, fmt.Sprint("work ", i))
		s.End()
		return i, nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Each key's span starts as the batch is read, before the claim.
	want := `idem.batch
  idem.do charge
    work 0
    complete (client)
  idem.do charge
    work 1
    complete (client)
  claim_batch (client)
`
	if got := tree(tr.take()); got != want {
		t.Fatalf("span tree:\n%s\nwant:\n%s", got, want)
	}
}

// With AnnotateParent, the span current when the call began (an HTTP
// server span) gets the idem attributes too.
func TestAnnotateParent(t *testing.T) {
	t.Parallel()
	tr := newTraced(t, &idemotel.TracerConfig{AnnotateParent: true, DBSystem: "redis"})
	eng := tr.engine(t, newMem(t), idem.Config{})
	ctx, req := tr.tp.Tracer("test").Start(context.Background(), "POST /charges")
	res, err := idem.Do(ctx, eng, charge("order-9"), func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	req.End()
	spans := tr.take()
	wantAttrs(t, "request", named(t, spans, "POST /charges").Attributes, map[attribute.Key]string{
		"idem.operation": "charge", "idem.key.hash": idemotel.KeyHash(res.StoreKey), "idem.outcome": "acquired", "idem.replayed": "false", "idem.fence": "1",
	})
	wantAttrs(t, "claim", named(t, spans, "claim").Attributes, map[attribute.Key]string{"db.system.name": "redis"})
}

func TestTracerConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := idemotel.NewTracer(nil, &idemotel.TracerConfig{DBSystem: " redis"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("%v, want ErrInvalidConfig", err)
	}
	if _, err := idemotel.NewTracer(nil, nil); err != nil {
		t.Fatal(err)
	}
}

// A call that is not sampled records nothing, and runs as any other.
func TestUnsampledCallsRecordNothing(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	eng, err := idem.New(newMem(t), &idem.Config{Observer: idemotel.MustNewTracer(tp, nil)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []bool{false, true} {
		res, err := idem.Do(context.Background(), eng, charge("order-u"), func(context.Context) (int, error) { return 7, nil })
		if err != nil || res.Value != 7 || res.Replayed != want {
			t.Fatalf("%+v %v", res, err)
		}
	}
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Fatalf("%d spans recorded:\n%s", len(spans), tree(spans))
	}
}

// A call that waits for another holder has an idem.wait event per wait
// and ends in_progress; a duplicate in the same process joins the call in
// flight (idem.join); an outcome write that failed on a transient fault
// has an idem.write.retry event and a failed store span before the one
// that landed.
func TestTraceEventsOfWaitsJoinsAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTraced(t, nil)
		mem := newMem(t)
		faulty := faultstore.New(mem)
		cfg := idem.Config{Clock: store.SystemClock{}, Wait: 300 * time.Millisecond}
		holder, waiter := tr.engine(t, mem, cfg), tr.engine(t, faulty, cfg)
		ctx := context.Background()
		if _, err := holder.Begin(ctx, charge("order-w"), &idem.BeginOptions{ExpectedCompletion: time.Hour}); err != nil {
			t.Fatal(err)
		}
		tr.take()
		// Another process waits, then gives up.
		if _, err := idem.Do(ctx, waiter, charge("order-w"), func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("%v, want ErrInProgress", err)
		}
		spans := tr.take()
		call := named(t, spans, "idem.do charge")
		var waits int
		for _, ev := range call.Events {
			if ev.Name == "idem.wait" {
				waits++
				if a := attrs(ev.Attributes); a["idem.owner"] == "" || a["idem.lease_until"] == "" {
					t.Errorf("wait event without the holder: %v", a)
				}
			}
		}
		if waits < 2 {
			t.Errorf("%d idem.wait events, want one per wait", waits)
		}
		wantAttrs(t, "waiter", call.Attributes, map[attribute.Key]string{"idem.outcome": "in_progress", "error.type": "in_progress"})

		// A duplicate in the same process joins; the first's complete
		// fails once and is retried.
		faulty.FailWith("complete", func(n int64) error {
			if n == 1 {
				return fmt.Errorf("reset: %w", store.ErrUnavailable)
			}
			return nil
		})
		inside, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 2)
		go func() {
			_, err := idem.Do(ctx, waiter, charge("order-r"), func(context.Context) (int, error) { close(inside); <-release; return 1, nil })
			done <- err
		}()
		<-inside
		go func() {
			_, err := idem.Do(ctx, waiter, charge("order-r"), func(context.Context) (int, error) { return 2, nil })
			done <- err
		}()
		synctest.Wait() // the duplicate has joined
		close(release)
		for range 2 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		spans = tr.take()
		var joined, retried bool
		for _, s := range spans {
			for _, ev := range s.Events {
				switch ev.Name {
				case "idem.join":
					joined = true
				case "idem.write.retry":
					retried = true
					wantAttrs(t, "retry", ev.Attributes, map[attribute.Key]string{"db.operation.name": "complete", "idem.attempt": "1", "error.type": "store_unavailable"})
				}
			}
		}
		if !joined || !retried {
			t.Errorf("joined %v, retried %v:\n%s", joined, retried, tree(spans))
		}
		var completes []string
		for _, s := range spans {
			if s.Name == "complete" {
				completes = append(completes, attrs(s.Attributes)["error.type"])
			}
		}
		if !slices.Equal(completes, []string{"unavailable", ""}) {
			t.Errorf("complete spans with error.type %q, want a failed one, then one that landed", completes)
		}
	})
}
