package idemlambda

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

// HTTPConfig configures the API Gateway and Function URL adapters, which
// answer like idemhttp: the Idempotency-Key header (an RFC 8941 string, or
// a bare token), 400/409/422/503 as problem+json proxy responses, and
// replays marked "Idempotent-Replayed: true". E is the event type.
type HTTPConfig[E any] struct {
	// Scope is the operation name; default as in [Config].
	Scope string
	// Methods covered; others run unprotected. Default POST and PATCH.
	Methods []string
	// Required answers 400 to a covered request without a key.
	Required bool
	// Principal names the caller (for instance from the authorizer's
	// claims), so that two callers' keys never meet; an error answers 401.
	// Nil: all callers share one key space.
	Principal func(E) (string, error)
	// FingerprintHeaders are request headers fingerprinted with the
	// method, path, query and body.
	FingerprintHeaders []string
	// ReplayHeaders are replayed besides idemhttp.DefaultReplayHeaders.
	ReplayHeaders []string
	// MaxResponseBytes caps a stored response body; retries of a larger
	// one get 410. Default 1 MiB.
	MaxResponseBytes int
	// Release decides from the status that a response is not final.
	// Default: status >= 500.
	Release func(status int) bool
	// Logger receives refusals with status 500 and above. Default
	// slog.Default().
	Logger *slog.Logger
}

// Response is a stored proxy response.
type Response struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   string            `json:"body,omitempty"`
	Base64 bool              `json:"base64,omitempty"`
}

// request is what the HTTP adapters read from an event.
type request struct {
	method, route, path, query string
	header                     func(name string) []string
	body                       string
	base64                     bool
}

type httpKind[E, R any] struct {
	request  func(E) request
	response func(R) Response
	build    func(Response) R
}

type httpAdapter[E, R any] struct {
	eng     *idem.Engine
	kind    httpKind[E, R]
	cfg     HTTPConfig[E]
	methods map[string]bool
	allow   map[string]bool
	fp      []string
}

func newHTTPAdapter[E, R any](eng *idem.Engine, name string, kind httpKind[E, R], cfg *HTTPConfig[E]) (*httpAdapter[E, R], error) {
	if eng == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine is nil", idem.ErrInvalidConfig)
	}
	a := &httpAdapter[E, R]{eng: eng, kind: kind, methods: map[string]bool{}, allow: map[string]bool{}}
	if cfg != nil {
		a.cfg = *cfg
	}
	var err error
	if a.cfg.Scope, err = scopeFor(name, a.cfg.Scope); err != nil {
		return nil, err
	}
	if a.cfg.Methods == nil {
		a.cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for _, m := range a.cfg.Methods {
		a.methods[strings.ToUpper(m)] = true
	}
	for _, h := range append(slices.Clone(idemhttp.DefaultReplayHeaders), a.cfg.ReplayHeaders...) {
		ch := http.CanonicalHeaderKey(h)
		if slices.Contains(idemhttp.NeverReplayed, ch) {
			return nil, fmt.Errorf("%w: idemlambda: ReplayHeaders: %s is never replayed", idem.ErrInvalidConfig, ch)
		}
		a.allow[ch] = true
	}
	for _, h := range a.cfg.FingerprintHeaders {
		a.fp = append(a.fp, http.CanonicalHeaderKey(h))
	}
	sort.Strings(a.fp)
	if a.cfg.MaxResponseBytes <= 0 {
		a.cfg.MaxResponseBytes = 1 << 20
	}
	if a.cfg.Release == nil {
		a.cfg.Release = func(status int) bool { return status >= 500 }
	}
	if a.cfg.Logger == nil {
		a.cfg.Logger = slog.Default()
	}
	return a, nil
}

type errReleased struct{ status int }

func (e *errReleased) Error() string {
	return "idemlambda: status " + strconv.Itoa(e.status) + " is not final; key released"
}

func (a *httpAdapter[E, R]) handle(ctx context.Context, ev E, fn func(context.Context, E) (R, error)) (R, error) {
	req := a.kind.request(ev)
	if !a.methods[strings.ToUpper(req.method)] {
		return fn(ctx, ev)
	}
	values := req.header(idemhttp.HeaderName)
	if len(values) == 0 && !a.cfg.Required {
		return fn(ctx, ev)
	}
	key, err := idemhttp.ParseKey(values)
	if err != nil {
		return a.problem(req, err), nil
	}
	principal := ""
	if a.cfg.Principal != nil {
		if principal, err = a.cfg.Principal(ev); err != nil {
			return a.problem(req, &idemhttp.PrincipalError{Err: err}), nil
		}
	}
	k, err := idemhttp.StoreKey(a.cfg.Scope, principal, req.method, req.route, key)
	if err != nil {
		return a.problem(req, err), nil
	}
	id := idem.Identity{Key: k, Fingerprint: a.fingerprint(req)}

	var (
		ran   bool
		first R
	)
	res, err := idem.DoIdentity(ctx, a.eng, id, func(ctx context.Context) (Response, error) {
		ran = true
		r, err := fn(ctx, ev)
		if err != nil {
			return Response{}, err
		}
		first = r
		resp := a.kind.response(r)
		switch {
		case a.cfg.Release(resp.Status):
			return Response{}, &errReleased{status: resp.Status}
		case len(resp.Body) > a.cfg.MaxResponseBytes:
			return Response{}, &idem.TerminalError{Code: idem.CodeResultTooLarge,
				Message: fmt.Sprintf("response body of %d bytes is over the limit of %d", len(resp.Body), a.cfg.MaxResponseBytes)}
		}
		return a.stored(resp), nil
	})
	if ran {
		var rel *errReleased
		var term *idem.TerminalError
		if err == nil || errors.As(err, &rel) || errors.As(err, &term) && term.Code == idem.CodeResultTooLarge {
			return first, nil
		}
		var zero R
		return zero, err // the handler's own error: released, Lambda reports it
	}
	if err != nil {
		return a.problem(req, err), nil
	}
	resp := res.Value
	h := make(map[string]string, len(resp.Header)+1)
	// Filtered again, as idemhttp does: an allowlist may have shrunk since.
	for name, v := range resp.Header {
		if a.allow[name] {
			h[name] = v
		}
	}
	h[idemhttp.ReplayedHeader] = "true"
	resp.Header = h
	return a.kind.build(resp), nil
}

// stored keeps the allowlisted headers of a response.
func (a *httpAdapter[E, R]) stored(r Response) Response {
	out := Response{Status: r.Status, Body: r.Body, Base64: r.Base64}
	for name, v := range r.Header {
		if ch := http.CanonicalHeaderKey(name); a.allow[ch] {
			if out.Header == nil {
				out.Header = map[string]string{}
			}
			out.Header[ch] = v
		}
	}
	return out
}

func (a *httpAdapter[E, R]) fingerprint(r request) string {
	h := idemhttp.NewFingerprint(strings.ToUpper(r.method), r.path, r.query, r.header, a.fp)
	body := []byte(r.body)
	if r.base64 {
		if b, err := base64.StdEncoding.DecodeString(r.body); err == nil {
			body = b
		}
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// problem answers a refused request with problem+json, as idemhttp does.
func (a *httpAdapter[E, R]) problem(req request, err error) R {
	p := idemhttp.ProblemFor(err, a.eng.Config().Clock.Now(), time.Second)
	p.Instance = req.path
	if p.Status >= 500 {
		a.cfg.Logger.Warn("idemlambda: request refused", "method", req.method, "path", req.path, "status", p.Status, "err", err)
	}
	b, h := p.Render()
	return a.kind.build(Response{Status: p.Status, Header: h, Body: string(b)})
}

// headerLookup finds a header by case-insensitive name in a single-value
// map and, when given, a multi-value map.
func headerLookup(single map[string]string, multi map[string][]string) func(string) []string {
	return func(name string) []string {
		for k, v := range multi {
			if strings.EqualFold(k, name) {
				return v
			}
		}
		for k, v := range single {
			if strings.EqualFold(k, name) {
				return []string{v}
			}
		}
		return nil
	}
}

// sortedQuery renders query parameters in a fixed order.
func sortedQuery(multi map[string][]string, single map[string]string) string {
	var parts []string
	for k, vs := range multi {
		for _, v := range vs {
			parts = append(parts, k+"="+v)
		}
	}
	if len(multi) == 0 {
		for k, v := range single {
			parts = append(parts, k+"="+v)
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "&")
}

// APIGatewayV1 makes an API Gateway REST API (proxy integration) handler
// idempotent. The route is the resource ("/orders/{id}").
func APIGatewayV1(eng *idem.Engine, name string, fn func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), cfg *HTTPConfig[events.APIGatewayProxyRequest]) (func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error), error) {
	a, err := newHTTPAdapter(eng, name, httpKind[events.APIGatewayProxyRequest, events.APIGatewayProxyResponse]{
		request: func(e events.APIGatewayProxyRequest) request {
			return request{method: e.HTTPMethod, route: e.Resource, path: e.Path,
				query:  sortedQuery(e.MultiValueQueryStringParameters, e.QueryStringParameters),
				header: headerLookup(e.Headers, e.MultiValueHeaders), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.APIGatewayProxyResponse) Response {
			return Response{Status: r.StatusCode, Header: mergeHeaders(r.Headers, r.MultiValueHeaders), Body: r.Body, Base64: r.IsBase64Encoded}
		},
		build: func(r Response) events.APIGatewayProxyResponse {
			return events.APIGatewayProxyResponse{StatusCode: r.Status, Headers: r.Header, Body: r.Body, IsBase64Encoded: r.Base64}
		},
	}, cfg)
	if err != nil || fn == nil {
		return nil, errors.Join(err, nilHandler(fn == nil))
	}
	return func(ctx context.Context, e events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		return a.handle(ctx, e, fn)
	}, nil
}

// APIGatewayV2 makes an API Gateway HTTP API (payload format 2.0) handler
// idempotent. The route is the route key ("POST /orders").
func APIGatewayV2(eng *idem.Engine, name string, fn func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), cfg *HTTPConfig[events.APIGatewayV2HTTPRequest]) (func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error), error) {
	a, err := newHTTPAdapter(eng, name, httpKind[events.APIGatewayV2HTTPRequest, events.APIGatewayV2HTTPResponse]{
		request: func(e events.APIGatewayV2HTTPRequest) request {
			return request{method: e.RequestContext.HTTP.Method, route: e.RouteKey, path: e.RawPath, query: e.RawQueryString,
				header: headerLookup(e.Headers, nil), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.APIGatewayV2HTTPResponse) Response {
			return Response{Status: r.StatusCode, Header: mergeHeaders(r.Headers, r.MultiValueHeaders), Body: r.Body, Base64: r.IsBase64Encoded}
		},
		build: func(r Response) events.APIGatewayV2HTTPResponse {
			return events.APIGatewayV2HTTPResponse{StatusCode: r.Status, Headers: r.Header, Body: r.Body, IsBase64Encoded: r.Base64}
		},
	}, cfg)
	if err != nil || fn == nil {
		return nil, errors.Join(err, nilHandler(fn == nil))
	}
	return func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return a.handle(ctx, e, fn)
	}, nil
}

// FunctionURL makes a Lambda Function URL handler idempotent. The route is
// the path.
func FunctionURL(eng *idem.Engine, name string, fn func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error), cfg *HTTPConfig[events.LambdaFunctionURLRequest]) (func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error), error) {
	a, err := newHTTPAdapter(eng, name, httpKind[events.LambdaFunctionURLRequest, events.LambdaFunctionURLResponse]{
		request: func(e events.LambdaFunctionURLRequest) request {
			return request{method: e.RequestContext.HTTP.Method, route: e.RawPath, path: e.RawPath, query: e.RawQueryString,
				header: headerLookup(e.Headers, nil), body: e.Body, base64: e.IsBase64Encoded}
		},
		response: func(r events.LambdaFunctionURLResponse) Response {
			return Response{Status: r.StatusCode, Header: r.Headers, Body: r.Body, Base64: r.IsBase64Encoded}
		},
		build: func(r Response) events.LambdaFunctionURLResponse {
			return events.LambdaFunctionURLResponse{StatusCode: r.Status, Headers: r.Header, Body: r.Body, IsBase64Encoded: r.Base64}
		},
	}, cfg)
	if err != nil || fn == nil {
		return nil, errors.Join(err, nilHandler(fn == nil))
	}
	return func(ctx context.Context, e events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return a.handle(ctx, e, fn)
	}, nil
}

func nilHandler(isNil bool) error {
	if isNil {
		return fmt.Errorf("%w: idemlambda: handler is nil", idem.ErrInvalidConfig)
	}
	return nil
}

// mergeHeaders folds multi-value headers into single values (comma
// joined), the form replayed.
func mergeHeaders(single map[string]string, multi map[string][]string) map[string]string {
	out := make(map[string]string, len(single)+len(multi))
	for k, v := range single {
		out[k] = v
	}
	for k, vs := range multi {
		if _, ok := out[k]; !ok {
			out[k] = strings.Join(vs, ",")
		}
	}
	return out
}
