package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// clocked returns two engines (the function's and a worker's) over one
// fresh memstore, on one manual clock starting at t0. t0 lies in the
// future, so that a context deadline set from the clock never passes in
// real time: the engines' clock decides.
func clocked(t *testing.T) (fn, worker *idem.Engine, clock *clocktest.Clock) {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	clock = clocktest.New(t0)
	eng := func(s store.Store) *idem.Engine {
		e, err := idem.New(s, &idem.Config{Clock: clock, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	return eng(mem), eng(mem), clock
}

// invocation returns the context of an invocation whose deadline is 3s
// from now on clock, the engines' clock.
func invocation(t *testing.T, clock *clocktest.Clock) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(3*time.Second))
	t.Cleanup(cancel)
	return ctx
}

// An API Gateway handler accepts work through idemhttp's asynchronous
// mode: 202 and a Location; a retry gets 202 and the status; a GET event
// for the Location gets the status resource, its caller's only; once a
// worker completed the key, a retry gets the worker's response.
func TestAPIGatewayV2AcceptsWork(t *testing.T) {
	t.Parallel()
	eng, workerEng, clock := clocked(t)
	var runs atomic.Int64
	jobs := make(chan string, 4)
	h, err := idemlambda.APIGatewayV2(eng, "transfers", func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		runs.Add(1)
		acc, err := idemhttp.AcceptContext(ctx)
		if err != nil {
			return events.APIGatewayV2HTTPResponse{StatusCode: 503}, nil
		}
		jobs <- acc.Token.String()
		return events.APIGatewayV2HTTPResponse{StatusCode: 202, Body: `{"queued":true}`, Headers: map[string]string{
			"Content-Type": "application/json", "Location": acc.Location, "Retry-After": "600"}}, nil
	}, &idemlambda.HTTPConfig[events.APIGatewayV2HTTPRequest]{
		Config: idemhttp.Config{Operation: "transfers", Required: true, StatusPath: "/idempotency/status/"},
		Principal: func(e events.APIGatewayV2HTTPRequest) (string, error) {
			return e.RequestContext.Authorizer.JWT.Claims["sub"], nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayV2HTTPRequest
	load(t, "apigw-v2.json", &ev)
	first, err := h(invocation(t, clock), ev)
	loc := first.Headers["Location"]
	if err != nil || first.StatusCode != 202 || !strings.HasPrefix(loc, "/idempotency/status/") {
		t.Fatalf("first: %+v %v", first, err)
	}
	tok := <-jobs

	clock.Advance(time.Minute) // past the invocation's deadline: the claim is the work's
	ctx := invocation(t, clock)
	dup, err := h(ctx, ev)
	var s idemhttp.StatusResource
	if err != nil || dup.StatusCode != 202 || dup.Headers["Location"] != loc || dup.Headers["Retry-After"] != "540" ||
		dup.Headers["Content-Type"] != "application/json" || json.Unmarshal([]byte(dup.Body), &s) != nil ||
		s.Status != "IN_PROGRESS" || !s.ExpectedCompletion.Equal(t0.Add(10*time.Minute)) || runs.Load() != 1 {
		t.Fatalf("duplicate during the work: %+v %v, runs %d", dup, err, runs.Load())
	}

	get := func(sub string) events.APIGatewayV2HTTPResponse {
		g := ev
		g.RouteKey, g.RawPath, g.RawQueryString, g.Body, g.IsBase64Encoded = "GET /idempotency/status/{id}", loc, "", "", false
		g.RequestContext.HTTP.Method = "GET"
		g.Headers = map[string]string{"host": ev.Headers["host"]}
		g.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"sub": sub}}}
		r, err := h(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := get("user-7"); r.StatusCode != 200 || r.Headers["Content-Type"] != "application/json" || !strings.Contains(r.Body, `"status":"IN_PROGRESS"`) {
		t.Fatalf("status event: %+v", r)
	}
	if r := get("user-8"); r.StatusCode != 404 || problemType(t, 404, r.Headers, r.Body) != idemhttp.ProblemStatusNotFound {
		t.Fatalf("another principal's status event: %+v", r)
	}

	// The worker, with an engine of its own on the store.
	mw, err := idemhttp.New(workerEng, &idemhttp.Config{Operation: "transfers"})
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.Complete(context.Background(), tok, idemhttp.Response{Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"transfer":"tr_1"}`)}); err != nil {
		t.Fatal(err)
	}
	again, err := h(ctx, ev)
	if err != nil || again.StatusCode != 201 || again.Body != `{"transfer":"tr_1"}` || again.Headers[idemhttp.ReplayedHeader] != "true" || runs.Load() != 1 {
		t.Fatalf("after the work: %+v %v", again, err)
	}
	if r := get("user-7"); r.StatusCode != 200 || json.Unmarshal([]byte(r.Body), &s) != nil || s.Status != "COMPLETED" ||
		s.Result == nil || string(s.Result.Body) != `{"transfer":"tr_1"}` {
		t.Fatalf("status after the work: %+v", r)
	}
}

// A handler under Wrap hands its work off with idem.Detach: the claim
// then outlives the invocation's deadline (its lease becomes the expected
// completion), a duplicate invocation gets an *idem.InProgressError with
// the execution reference instead of running again, and a worker's
// Complete is what later invocations get. A handler that does not hand
// off holds its claim only until the deadline.
func TestWrapHandOffOutlivesTheInvocationDeadline(t *testing.T) {
	t.Parallel()
	type in struct{ Order string }
	type out struct{ Status, Charge string }
	eng, workerEng, clock := clocked(t)
	var runs atomic.Int64
	var tok idem.Token
	h, err := idemlambda.Wrap(eng, "charge", func(ctx context.Context, e in) (out, error) {
		runs.Add(1)
		claim, _ := idem.FromContext(ctx)
		key, _ := idem.ParseStoreKey(claim.Key)
		st, err := eng.Status(ctx, key)
		if dl, _ := ctx.Deadline(); err != nil || !st.LeaseUntil.Equal(dl) {
			t.Errorf("claim while the handler runs: %+v %v, want its lease at the invocation's deadline", st, err)
		}
		if e.Order == "o-sync" {
			// Cut off, not knowing: the claim stays until its lease ends.
			return out{}, idem.Uncertain(errors.New("downstream timed out"))
		}
		if tok, err = idem.Detach(ctx, 15*time.Minute, "arn:aws:states:eu-west-1:1:execution:charges:o-1"); err != nil {
			return out{}, err
		}
		return out{Status: "accepted"}, nil
	}, &idemlambda.FuncConfig[in, out]{Config: idemlambda.Config{Operation: "charges"},
		Key: func(_ context.Context, e in) (string, error) { return e.Order, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := invocation(t, clock)
	ev := func(order string) json.RawMessage { return json.RawMessage(`{"Order":"` + order + `"}`) }

	if r, err := h(ctx, ev("o-1")); err != nil || r.Status != "accepted" {
		t.Fatalf("handing off: %+v %v", r, err)
	}
	st, err := eng.Status(ctx, tok.Key)
	if err != nil || st.Status != idem.StatusInProgress || !st.LeaseUntil.Equal(t0.Add(15*time.Minute)) {
		t.Fatalf("claim after the hand-off: %+v %v, want IN_PROGRESS until t0+15m", st, err)
	}
	if _, err := h(ctx, ev("o-sync")); !errors.Is(err, idem.ErrUncertain) {
		t.Fatalf("uncertain: %v", err)
	}

	clock.Advance(time.Minute) // both invocations' deadlines have passed
	ctx = invocation(t, clock)
	_, err = h(ctx, ev("o-1"))
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ipe.Ref != "arn:aws:states:eu-west-1:1:execution:charges:o-1" || runs.Load() != 2 {
		t.Fatalf("duplicate of handed-off work: %v, runs %d; want an InProgressError with the reference", err, runs.Load())
	}
	if r, err := h(ctx, ev("o-sync")); !errors.Is(err, idem.ErrUncertain) || runs.Load() != 3 {
		t.Fatalf("after the deadline, a claim not handed off is taken over: %+v %v, runs %d", r, err, runs.Load())
	}

	if err := workerEng.Complete(context.Background(), tok, out{Status: "charged", Charge: "ch_1"}); err != nil {
		t.Fatal(err)
	}
	if r, err := h(ctx, ev("o-1")); err != nil || r != (out{Status: "charged", Charge: "ch_1"}) || runs.Load() != 3 {
		t.Fatalf("after the worker: %+v %v, runs %d", r, err, runs.Load())
	}
}
