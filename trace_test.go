package idem_test

import (
	"context"
	"encoding/base64"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// fakeTracer is an observe.Tracer that gives every call a span with a
// trace context of its own and records the links of the calls it starts.
type fakeTracer struct {
	observe.Counters
	mu    sync.Mutex
	n     byte
	links []observe.TraceContext
	calls []observe.Call
}

func (f *fakeTracer) StartCall(ctx context.Context, c observe.Call) (context.Context, observe.Span) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	f.links = append(f.links, c.Link)
	f.calls = append(f.calls, c)
	tc := observe.TraceContext{Flags: 1}
	tc.TraceID[0], tc.SpanID[0] = 0xaa, f.n
	return ctx, fakeSpan{tc}
}

type fakeSpan struct{ tc observe.TraceContext }

func (s fakeSpan) StartStore(ctx context.Context, _ observe.StoreOp) (context.Context, observe.StoreSpan) {
	return ctx, nil
}
func (fakeSpan) Outcome(observe.Outcome)                     {}
func (fakeSpan) Event(observe.Event)                         {}
func (s fakeSpan) TraceContext() observe.TraceContext        { return s.tc }
func (fakeSpan) Context(ctx context.Context) context.Context { return ctx }
func (fakeSpan) End(observe.CallEnd)                         {}

// A traced engine's tokens carry the trace context of the call that
// handed them out, through their string form, signed or not; a write
// through one is linked to it; tokens of an engine that does not trace
// carry none and keep the form they always had.
func TestTokensCarryTheTraceContext(t *testing.T) {
	t.Parallel()
	for _, key := range [][]byte{nil, tokenKey} {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		t.Cleanup(func() { _ = mem.Close() })
		tr := &fakeTracer{}
		traced, err := idem.New(mem, &idem.Config{Observer: tr, TokenKey: key})
		if err != nil {
			t.Fatal(err)
		}
		plain, err := idem.New(mem, &idem.Config{TokenKey: key})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		b, err := traced.Begin(ctx, req("traced"), nil)
		if err != nil || !b.Acquired {
			t.Fatalf("%+v %v", b, err)
		}
		const want = "00-aa000000000000000000000000000000-0100000000000000-01"
		if got := b.Token.TraceParent(); got != want {
			t.Fatalf("Begin's token carries %q, want %q", got, want)
		}
		tok, err := idem.ParseToken(b.Token.String(), "charge")
		if err != nil || tok != b.Token || tok.TraceParent() != want {
			t.Fatalf("round trip: %+v %v", tok, err)
		}
		// Another engine, traced, links its write to the token's call.
		if err := traced.Complete(ctx, tok, 1); err != nil {
			t.Fatal(err)
		}
		if got := tr.links[len(tr.links)-1].String(); got != want {
			t.Fatalf("Complete linked to %q, want %q", got, want)
		}
		// An engine that does not trace hands out tokens as before: no
		// trace context, version 1 (2 signed).
		pb, err := plain.Begin(ctx, req("plain"), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.RawURLEncoding.DecodeString(pb.Token.String())
		if wantV := map[bool]byte{false: 1, true: 2}[key != nil]; raw[0] != wantV || pb.Token.TraceParent() != "" {
			t.Fatalf("untraced token: version %d, trace %q", raw[0], pb.Token.TraceParent())
		}
		// The trace context is not signed: moved to another token, the
		// signature still holds, and the write is linked.
		moved := pb.Token.WithTraceOf(b.Token)
		if moved.TraceParent() != want {
			t.Fatalf("WithTraceOf: %q", moved.TraceParent())
		}
		again, err := idem.ParseToken(moved.String(), "")
		if err != nil || again != moved {
			t.Fatalf("round trip of a moved trace: %+v %v", again, err)
		}
		if err := traced.Release(ctx, again); err != nil {
			t.Fatalf("release through a token with a moved trace context: %v", err)
		}
		if got := tr.links[len(tr.links)-1].String(); got != want {
			t.Fatalf("Release linked to %q, want %q", got, want)
		}
	}
}

// Detach hands out the token of the running call, with its trace context.
func TestDetachedTokenCarriesTheCallsTrace(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	tr := &fakeTracer{}
	e, err := idem.New(mem, &idem.Config{Observer: tr})
	if err != nil {
		t.Fatal(err)
	}
	var tok idem.Token
	var fromClaim string
	if _, err := idem.Do(context.Background(), e, req("detach"), func(ctx context.Context) (int, error) {
		c, _ := idem.FromContext(ctx)
		fromClaim = c.Token().TraceParent()
		var err error
		tok, err = idem.Detach(ctx, time.Minute, "")
		return 0, err
	}); err != nil {
		t.Fatal(err)
	}
	const want = "00-aa000000000000000000000000000000-0100000000000000-01"
	if tok.TraceParent() != want || fromClaim != want {
		t.Fatalf("Detach's token carries %q, Claim.Token %q; want %q", tok.TraceParent(), fromClaim, want)
	}
}

// Malformed trace contexts in a token are refused with ErrInvalidToken.
func TestTokenTraceContextMustBeValid(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	e, err := idem.New(mem, &idem.Config{Observer: &fakeTracer{}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Begin(context.Background(), req("bad-trace"), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(b.Token.String())
	keyEnd := len(raw) - len(b.Token.Owner) - 25
	zeroed := append([]byte(nil), raw...)
	clear(zeroed[keyEnd : keyEnd+16]) // an all-zero trace id
	for name, s := range map[string]string{
		"zero trace id": base64.RawURLEncoding.EncodeToString(zeroed),
		"truncated":     base64.RawURLEncoding.EncodeToString(raw[:keyEnd+10]),
	} {
		if _, err := idem.ParseToken(s, ""); !errors.Is(err, idem.ErrInvalidToken) {
			t.Errorf("%s: %v, want ErrInvalidToken", name, err)
		}
	}
}
