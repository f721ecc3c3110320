package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemlambda"
)

func problemType(t *testing.T, status int, headers map[string]string, body string) string {
	t.Helper()
	if headers["Content-Type"] != "application/problem+json" {
		t.Fatalf("status %d, Content-Type %q, body %s", status, headers["Content-Type"], body)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != status {
		t.Fatalf("problem %s: %v", body, err)
	}
	return strings.TrimPrefix(p.Type, idemhttp.ProblemTypeBase)
}

func TestAPIGatewayV1(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	inside, finish := make(chan struct{}, 1), make(chan struct{})
	status := atomic.Int64{}
	status.Store(201)
	h, err := idemlambda.APIGatewayV1(engine(t, idem.Config{}), "orders", func(ctx context.Context, e events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		runs.Add(1)
		if e.QueryStringParameters["block"] == "1" {
			inside <- struct{}{}
			<-finish
		}
		return events.APIGatewayProxyResponse{StatusCode: int(status.Load()), Body: `{"id":"ord_1"}`,
			Headers:           map[string]string{"Content-Type": "application/json", "Location": "/orders/ord_1", "X-Private": "p"},
			MultiValueHeaders: map[string][]string{"Set-Cookie": {"session=secret"}}}, nil
	}, &idemlambda.HTTPConfig[events.APIGatewayProxyRequest]{
		Principal: func(e events.APIGatewayProxyRequest) (string, error) {
			sub, _ := e.RequestContext.Authorizer["claims"].(map[string]any)["sub"].(string)
			return sub, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayProxyRequest
	load(t, "apigw-v1.json", &ev)
	ctx := context.Background()

	first, err := h(ctx, ev)
	if err != nil || first.StatusCode != 201 || first.Headers[idemhttp.ReplayedHeader] != "" {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := h(ctx, ev)
	if err != nil || again.StatusCode != 201 || again.Body != first.Body || again.Headers[idemhttp.ReplayedHeader] != "true" ||
		again.Headers["Location"] != "/orders/ord_1" || again.Headers["Set-Cookie"] != "" || again.Headers["X-Private"] != "p" || len(again.MultiValueHeaders) != 0 {
		t.Fatalf("replay: %+v %v", again, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}

	other := ev
	other.Body = `{"item":"book","qty":2}`
	r, _ := h(ctx, other)
	if problemType(t, r.StatusCode, r.Headers, r.Body) != idemhttp.ProblemKeyReused || r.StatusCode != 422 {
		t.Fatalf("422: %+v", r)
	}

	twice := ev
	twice.MultiValueHeaders = map[string][]string{"Idempotency-Key": {`"a"`, `"b"`}}
	r, _ = h(ctx, twice)
	if r.StatusCode != 400 || problemType(t, r.StatusCode, r.Headers, r.Body) != idemhttp.ProblemInvalidKey {
		t.Fatalf("two keys: %+v", r)
	}

	// Another principal with the same key runs on its own.
	bob := ev
	bob.RequestContext.Authorizer = map[string]any{"claims": map[string]any{"sub": "user-8"}}
	if r, _ := h(ctx, bob); r.StatusCode != 201 || r.Headers[idemhttp.ReplayedHeader] != "" || runs.Load() != 2 {
		t.Fatalf("other principal: %+v, runs %d", r, runs.Load())
	}

	// 409 while the first is running.
	slow := ev
	slow.Headers = map[string]string{"Idempotency-Key": "slow"}
	slow.MultiValueHeaders = nil
	slow.QueryStringParameters = map[string]string{"block": "1"}
	done := make(chan events.APIGatewayProxyResponse)
	go func() { r, _ := h(ctx, slow); done <- r }()
	<-inside
	r, _ = h(ctx, slow)
	if r.StatusCode != 409 || problemType(t, r.StatusCode, r.Headers, r.Body) != idemhttp.ProblemInProgress || r.Headers["Retry-After"] == "" {
		t.Fatalf("409: %+v", r)
	}
	close(finish)
	<-done

	// 5xx releases; GET passes through.
	status.Store(503)
	fail := ev
	fail.Headers = map[string]string{"Idempotency-Key": "fail"}
	fail.MultiValueHeaders = nil
	h(ctx, fail)
	h(ctx, fail)
	get := ev
	get.HTTPMethod = "GET"
	h(ctx, get)
	if runs.Load() != 6 {
		t.Fatalf("runs %d, want 6", runs.Load())
	}
}

func TestAPIGatewayV2AndFunctionURL(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	v2, err := idemlambda.APIGatewayV2(engine(t, idem.Config{}), "orders", func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		runs.Add(1)
		return events.APIGatewayV2HTTPResponse{StatusCode: 201, Body: "created", Cookies: []string{"s=1"},
			Headers: map[string]string{"content-type": "text/plain"}}, nil
	}, &idemlambda.HTTPConfig[events.APIGatewayV2HTTPRequest]{Config: idemhttp.Config{Required: true}})
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayV2HTTPRequest
	load(t, "apigw-v2.json", &ev)
	ctx := context.Background()
	v2(ctx, ev)
	r, err := v2(ctx, ev)
	if err != nil || r.StatusCode != 201 || r.Body != "created" || r.Headers[idemhttp.ReplayedHeader] != "true" ||
		r.Headers["Content-Type"] != "text/plain" || len(r.Cookies) != 0 || runs.Load() != 1 {
		t.Fatalf("v2 replay: %+v %v, runs %d", r, err, runs.Load())
	}
	// The base64 body is fingerprinted decoded: the same bytes sent plain
	// are the same request.
	plain := ev
	plain.Body, plain.IsBase64Encoded = `{"item":"book","qty":1}`, false
	if r, _ := v2(ctx, plain); r.Headers[idemhttp.ReplayedHeader] != "true" {
		t.Fatalf("plain body: %+v", r)
	}
	// HTTP API joins repeated headers with commas: that is two keys.
	joined := ev
	joined.Headers = map[string]string{"idempotency-key": `"a", "b"`}
	if r, _ := v2(ctx, joined); r.StatusCode != 400 {
		t.Fatalf("joined keys: %+v", r)
	}
	none := ev
	none.Headers = map[string]string{}
	if r, _ := v2(ctx, none); r.StatusCode != 400 || problemType(t, 400, r.Headers, r.Body) != idemhttp.ProblemMissingKey {
		t.Fatalf("required key: %+v", r)
	}

	url, err := idemlambda.FunctionURL(engine(t, idem.Config{}), "orders", func(ctx context.Context, e events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		runs.Add(1)
		return events.LambdaFunctionURLResponse{StatusCode: 200, Body: "ok"}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var fe events.LambdaFunctionURLRequest
	load(t, "function-url.json", &fe)
	url(ctx, fe)
	if r, _ := url(ctx, fe); r.Headers[idemhttp.ReplayedHeader] != "true" || r.Body != "ok" || runs.Load() != 2 {
		t.Fatalf("function URL replay: %+v, runs %d", r, runs.Load())
	}
}

func TestHandlerErrorsReleaseAndSurface(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	var runs atomic.Int64
	h, err := idemlambda.APIGatewayV2(engine(t, idem.Config{}), "orders", func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		if runs.Add(1) == 1 {
			return events.APIGatewayV2HTTPResponse{}, boom
		}
		return events.APIGatewayV2HTTPResponse{StatusCode: 201}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayV2HTTPRequest
	load(t, "apigw-v2.json", &ev)
	if _, err := h(context.Background(), ev); !errors.Is(err, boom) {
		t.Fatalf("handler error: %v", err)
	}
	if r, err := h(context.Background(), ev); err != nil || r.StatusCode != 201 || runs.Load() != 2 {
		t.Fatalf("retry: %+v %v", r, err)
	}
}

func TestHTTPConfigIsCheckedAsIdemhttpChecksIt(t *testing.T) {
	t.Parallel()
	eng := engine(t, idem.Config{})
	fn := func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return events.LambdaFunctionURLResponse{}, nil
	}
	for name, cfg := range map[string]idemlambda.HTTPConfig[events.LambdaFunctionURLRequest]{
		"lower-case method":    {Config: idemhttp.Config{Methods: []string{"post"}}},
		"negative body limit":  {Config: idemhttp.Config{MaxBodyBytes: -1}},
		"negative response":    {Config: idemhttp.Config{MaxResponseBytes: -1}},
		"negative retry-after": {Config: idemhttp.Config{StoreRetryAfter: -time.Second}},
		"never replayed":       {Config: idemhttp.Config{ReplayHeaders: []string{"set-cookie"}}},
		"scope":                {Config: idemhttp.Config{Operation: "has space"}},
	} {
		if _, err := idemlambda.FunctionURL(eng, "orders", fn, &cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := idemlambda.FunctionURL(eng, "orders", nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil handler: %v", err)
	}
	if _, err := idemlambda.FunctionURL(nil, "orders", fn, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil engine: %v", err)
	}
}

// The handler's context is the middleware's request context: it holds the
// claim, and MarkUncertain keeps the key until the lease ends.
func TestHandlerContextIsTheMiddlewares(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	h, err := idemlambda.FunctionURL(engine(t, idem.Config{}), "orders", func(ctx context.Context, e events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		runs.Add(1)
		if c, ok := idem.FromContext(ctx); !ok || c.Fence != 1 {
			t.Errorf("claim %+v, %v", c, ok)
		}
		if !idemhttp.MarkUncertain(ctx) {
			t.Error("MarkUncertain: not a request of the middleware")
		}
		return events.LambdaFunctionURLResponse{StatusCode: 504}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.LambdaFunctionURLRequest
	load(t, "function-url.json", &ev)
	if r, err := h(context.Background(), ev); err != nil || r.StatusCode != 504 {
		t.Fatalf("first: %+v %v", r, err)
	}
	r, _ := h(context.Background(), ev)
	if problemType(t, r.StatusCode, r.Headers, r.Body) != idemhttp.ProblemInProgress || r.StatusCode != 409 || runs.Load() != 1 {
		t.Fatalf("after an uncertain outcome: %+v, runs %d", r, runs.Load())
	}
}
