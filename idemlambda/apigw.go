package idemlambda

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

// HTTPConfig configures the API Gateway and Function URL adapters. They run
// package idemhttp's middleware, so they answer exactly as it does: the
// Idempotency-Key header (an RFC 8941 string, or a bare token), refusals as
// problem+json proxy responses, replays marked "Idempotent-Replayed: true".
// It is idemhttp.Config itself, with Principal reading the event; the
// route is the event's. E is the event type.
type HTTPConfig[E any] struct {
	// Config is idemhttp's configuration, which the adapter runs as it is
	// (every idemhttp field reaches Lambda, the asynchronous mode's
	// StatusPath and ExpectedCompletion among them), except that: the
	// adapter sets Route (the event's route) and MemoryBodyBytes (the body
	// is in memory already); MaxBodyBytes defaults to 6 MiB, Lambda's own
	// limit on an invocation's payload, so that by default no event is
	// refused; Operation defaults as in [Config]; and Principal is the
	// field below. StatusPath's path is the event's path (rawPath, or path
	// for a REST API), which is also the Location: where a stage or base
	// path prefixes the URL clients see, they see the Location without it;
	// route GET events for StatusPath + id to this function.
	idemhttp.Config
	// Principal names the caller from the event (for instance from the
	// authorizer's claims), so that two callers' keys never meet; an error
	// answers 401. Nil: all callers share one key space.
	Principal func(E) (string, error)
}

// lambdaPayloadLimit is the largest request payload Lambda accepts for a
// synchronous invocation; no body in an event can be larger.
const lambdaPayloadLimit = 6 << 20

// APIGatewayV1 makes an API Gateway REST API (proxy integration) handler
// idempotent. The route is the resource ("/orders/{id}").
func APIGatewayV1(eng *idem.Engine, name string, fn func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), cfg *HTTPConfig[events.APIGatewayProxyRequest]) (func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), error) {
	return newHTTPAdapter(eng, name, fn, cfg, proxyKind[events.APIGatewayProxyRequest, events.APIGatewayProxyResponse]{
		request: func(e events.APIGatewayProxyRequest) proxyRequest {
			return proxyRequest{method: e.HTTPMethod, route: e.Resource, rawPath: e.Path,
				rawQuery: encodeQuery(e.MultiValueQueryStringParameters, e.QueryStringParameters),
				header:   requestHeader(e.MultiValueHeaders, e.Headers, nil), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.APIGatewayProxyResponse) proxyResponse {
			return proxyResponse{status: r.StatusCode, header: r.Headers, multi: r.MultiValueHeaders, body: r.Body, base64: r.IsBase64Encoded}
		},
		build: func(r proxyResponse) events.APIGatewayProxyResponse {
			return events.APIGatewayProxyResponse{StatusCode: r.status, Headers: r.header, Body: r.body, IsBase64Encoded: r.base64}
		},
	})
}

// APIGatewayV2 makes an API Gateway HTTP API (payload format 2.0) handler
// idempotent. The route is the route key ("POST /orders").
func APIGatewayV2(eng *idem.Engine, name string, fn func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), cfg *HTTPConfig[events.APIGatewayV2HTTPRequest]) (func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), error) {
	return newHTTPAdapter(eng, name, fn, cfg, proxyKind[events.APIGatewayV2HTTPRequest, events.APIGatewayV2HTTPResponse]{
		request: func(e events.APIGatewayV2HTTPRequest) proxyRequest {
			return proxyRequest{method: e.RequestContext.HTTP.Method, route: e.RouteKey, rawPath: e.RawPath, rawQuery: e.RawQueryString,
				header: requestHeader(nil, e.Headers, e.Cookies), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.APIGatewayV2HTTPResponse) proxyResponse {
			return proxyResponse{status: r.StatusCode, header: r.Headers, multi: r.MultiValueHeaders, cookies: r.Cookies, body: r.Body, base64: r.IsBase64Encoded}
		},
		build: func(r proxyResponse) events.APIGatewayV2HTTPResponse {
			return events.APIGatewayV2HTTPResponse{StatusCode: r.status, Headers: r.header, Body: r.body, IsBase64Encoded: r.base64}
		},
	})
}

// FunctionURL makes a Lambda Function URL handler idempotent. The route is
// the path.
func FunctionURL(eng *idem.Engine, name string, fn func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error), cfg *HTTPConfig[events.LambdaFunctionURLRequest]) (func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error), error) {
	return newHTTPAdapter(eng, name, fn, cfg, proxyKind[events.LambdaFunctionURLRequest, events.LambdaFunctionURLResponse]{
		request: func(e events.LambdaFunctionURLRequest) proxyRequest {
			return proxyRequest{method: e.RequestContext.HTTP.Method, route: e.RawPath, rawPath: e.RawPath, rawQuery: e.RawQueryString,
				header: requestHeader(nil, e.Headers, e.Cookies), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.LambdaFunctionURLResponse) proxyResponse {
			return proxyResponse{status: r.StatusCode, header: r.Headers, cookies: r.Cookies, body: r.Body, base64: r.IsBase64Encoded}
		},
		build: func(r proxyResponse) events.LambdaFunctionURLResponse {
			return events.LambdaFunctionURLResponse{StatusCode: r.status, Headers: r.header, Body: r.body, IsBase64Encoded: r.base64}
		},
	})
}

// proxyKind converts one kind of proxy event and its response.
type proxyKind[E, R any] struct {
	request  func(E) proxyRequest
	response func(R) proxyResponse
	build    func(proxyResponse) R
}

// httpAdapter runs idemhttp's middleware over a handler of events: each
// event becomes an *http.Request for the middleware; when the middleware
// passes it on, the handler runs on the event and its response is written
// back for the middleware to capture, and when the middleware answers
// itself (a replay, a refusal), its answer becomes the response.
type httpAdapter[E, R any] struct {
	kind    proxyKind[E, R]
	fn      func(context.Context, E) (R, error)
	handler http.Handler // the middleware around serve
}

// invocation is one event on its way through the middleware.
type invocation[E, R any] struct {
	event E
	route string
	rec   recorder
	ran   bool // fn ran: out and err are its results
	out   R
	err   error
}

type invocationKey struct{}

func invocationOf[E, R any](r *http.Request) *invocation[E, R] {
	return r.Context().Value(invocationKey{}).(*invocation[E, R])
}

func newHTTPAdapter[E, R any](eng *idem.Engine, name string, fn func(context.Context, E) (R, error), cfg *HTTPConfig[E], kind proxyKind[E, R]) (func(context.Context, E) (R, error), error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	var c HTTPConfig[E]
	if cfg != nil {
		c = *cfg
	}
	op, err := operationFor(name, c.Operation)
	if err != nil {
		return nil, err
	}
	hc := c.Config
	hc.Operation = op
	if hc.MaxBodyBytes == 0 {
		hc.MaxBodyBytes = lambdaPayloadLimit
	}
	hc.Route = func(r *http.Request) string { return invocationOf[E, R](r).route }
	// The body is in the event, in memory already: never spooled.
	hc.MemoryBodyBytes = hc.MaxBodyBytes
	hc.Principal = nil
	if p := c.Principal; p != nil {
		hc.Principal = func(r *http.Request) (string, error) { return p(invocationOf[E, R](r).event) }
	}
	mw, err := idemhttp.New(eng, &hc)
	if err != nil {
		return nil, err
	}
	a := &httpAdapter[E, R]{kind: kind, fn: fn}
	a.handler = mw.Handler(http.HandlerFunc(a.serve))
	return a.handle, nil
}

// handle answers one event: with fn's own response (or error) when fn ran,
// else with what the middleware answered.
func (a *httpAdapter[E, R]) handle(ctx context.Context, ev E) (out R, err error) {
	p := a.kind.request(ev)
	inv := &invocation[E, R]{event: ev, route: p.route, rec: recorder{header: http.Header{}}}
	defer func() {
		if inv.err != nil {
			// serve aborted the request for fn's error (and only then).
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				panic(v)
			}
			var zero R
			out, err = zero, inv.err
		}
	}()
	a.handler.ServeHTTP(&inv.rec, p.httpRequest(context.WithValue(idem.EndsAtDeadline(ctx), invocationKey{}, inv)))
	if inv.ran {
		return inv.out, nil
	}
	return a.kind.build(inv.rec.response()), nil
}

// serve is the handler behind the middleware. The first caller gets fn's
// response as fn returned it; what is written here is what the middleware
// stores for replays.
func (a *httpAdapter[E, R]) serve(w http.ResponseWriter, r *http.Request) {
	inv := invocationOf[E, R](r)
	inv.ran, inv.rec.discard = true, true
	inv.out, inv.err = a.fn(r.Context(), inv.event)
	if inv.err != nil {
		// There is no HTTP response: Lambda reports the error (API
		// Gateway answers 502). Aborting the request is how net/http
		// says so, and the middleware releases the key of an aborted
		// request, so that a retry runs fn again.
		panic(http.ErrAbortHandler)
	}
	a.kind.response(inv.out).write(w)
}

// encodeQuery renders REST API query parameters as a query string, in a
// fixed order.
func encodeQuery(multi map[string][]string, single map[string]string) string {
	if len(multi) > 0 {
		return url.Values(multi).Encode()
	}
	q := make(url.Values, len(single))
	for k, v := range single {
		q.Set(k, v)
	}
	return q.Encode()
}
