package idemlambda_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// The table below runs through idemhttp's middleware on a real server and
// through each Lambda HTTP adapter; every adapter must give every request
// the middleware's answer: the same status, headers and body.

// semantics is the configuration of a case, given to every transport in
// its own form.
type semantics struct {
	required      bool
	principal     bool // the Authorization header names the caller
	replayHeaders []string
	fingerprint   []string // FingerprintHeaders
	maxBody       int64
	maxResponse   int
	retryAfter    time.Duration
	storeDown     bool // every claim fails: the store is unreachable
}

// appSpec is how the handler behind every transport answers.
type appSpec struct {
	status []int // run n answers status[n-1], the last one after that; default 201
	binary bool  // a body that is not UTF-8
	hold   bool  // the first run waits until the case has sent its other requests
}

// request is one request of a case, to /orders?src=web.
type request struct {
	method string
	header []string // name, value pairs; a name twice is two fields
	body   string
	held   bool // sent in the background; answered when the case ends
}

// step is a request and what the middleware answers to it.
type step struct {
	request
	status   int
	replayed bool
	problem  string            // the problem type's name, for a refusal
	has      map[string]string // headers, repeated ones joined with ","
	lacks    []string
}

type httpCase struct {
	name   string
	sem    semantics
	app    appSpec
	steps  []step
	runs   int64 // how often the handler runs
	fields bool  // a header is sent twice: only transports that carry two fields
}

func post(body string, header ...string) request {
	return request{method: "POST", body: body, header: header}
}

func key(k string, more ...string) []string { return append([]string{"Idempotency-Key", k}, more...) }

var httpCases = []httpCase{
	{name: "new request", runs: 1, steps: []step{
		{request: post(`{"qty":1}`, key("k")...), status: 201,
			has: map[string]string{"X-Charge-Id": "ch_1", "Set-Cookie": "session=s1", "Content-Type": "application/json"}},
	}},
	{name: "replay", runs: 1, steps: []step{
		{request: post(`{"qty":1}`, key("k")...), status: 201},
		{request: post(`{"qty":1}`, key("k")...), status: 201, replayed: true, has: map[string]string{"X-Charge-Id": "ch_1"}},
	}},
	{name: "in-progress duplicate", app: appSpec{hold: true}, runs: 1, steps: []step{
		{request: request{method: "POST", body: `{"qty":1}`, header: key("k"), held: true}, status: 201},
		// Retry-After: as long again as the first has run (no time yet on the
		// engine's clock: at least 100ms), in whole seconds.
		{request: post(`{"qty":1}`, key("k")...), status: 409, problem: idemhttp.ProblemInProgress, has: map[string]string{"Retry-After": "1"}},
	}},
	{name: "payload mismatch", runs: 1, steps: []step{
		{request: post(`{"qty":1}`, key("k")...), status: 201},
		{request: post(`{"qty":2}`, key("k")...), status: 422, problem: idemhttp.ProblemKeyReused},
	}},
	{name: "payload mismatch in a fingerprinted header", sem: semantics{fingerprint: []string{"x-account", "X-Account"}}, runs: 1, steps: []step{
		{request: post(`{}`, key("k", "X-Account", "a")...), status: 201},
		{request: post(`{}`, key("k", "X-Account", "a")...), status: 201, replayed: true},
		{request: post(`{}`, key("k", "X-Account", "b")...), status: 422, problem: idemhttp.ProblemKeyReused},
	}},
	{name: "bad key", steps: []step{
		{request: post(`{}`, key(`"unterminated`)...), status: 400, problem: idemhttp.ProblemInvalidKey},
	}},
	{name: "two keys in one field", steps: []step{
		{request: post(`{}`, key(`"a", "b"`)...), status: 400, problem: idemhttp.ProblemInvalidKey},
	}},
	{name: "two key fields", fields: true, steps: []step{
		{request: post(`{}`, key("a", "Idempotency-Key", "b")...), status: 400, problem: idemhttp.ProblemInvalidKey},
	}},
	{name: "missing key when required", sem: semantics{required: true}, steps: []step{
		{request: post(`{}`), status: 400, problem: idemhttp.ProblemMissingKey},
	}},
	{name: "no key runs unprotected", runs: 2, steps: []step{
		{request: post(`{}`), status: 201},
		{request: post(`{}`), status: 201, has: map[string]string{"X-Charge-Id": "ch_2"}},
	}},
	{name: "lower-case method is not covered", runs: 2, steps: []step{
		{request: request{method: "post", header: key("k"), body: `{}`}, status: 201},
		{request: request{method: "post", header: key("k"), body: `{}`}, status: 201, has: map[string]string{"X-Charge-Id": "ch_2"}},
	}},
	{name: "uncovered method", runs: 2, steps: []step{
		{request: request{method: "GET", header: key("k")}, status: 201},
		{request: request{method: "GET", header: key("k")}, status: 201},
	}},
	{name: "body too large", sem: semantics{maxBody: 64}, steps: []step{
		{request: post(strings.Repeat("x", 65), key("k")...), status: 413, problem: idemhttp.ProblemBodyTooLarge},
	}},
	{name: "response too large to store", sem: semantics{maxResponse: 8}, runs: 1, steps: []step{
		{request: post(`{}`, key("k")...), status: 201},
		{request: post(`{}`, key("k")...), status: 410, problem: idemhttp.ProblemResponseNotSaved},
	}},
	{name: "handler 5xx releases the key", app: appSpec{status: []int{503, 201}}, runs: 2, steps: []step{
		{request: post(`{}`, key("k")...), status: 503},
		{request: post(`{}`, key("k")...), status: 201, has: map[string]string{"X-Charge-Id": "ch_2"}},
		{request: post(`{}`, key("k")...), status: 201, replayed: true, has: map[string]string{"X-Charge-Id": "ch_2"}},
	}},
	{name: "custom response headers replayed", runs: 1, steps: []step{
		{request: post(`{}`, key("k")...), status: 201},
		{request: post(`{}`, key("k")...), status: 201, replayed: true, has: map[string]string{
			"X-Charge-Id": "ch_1", "Location": "/orders/1", "Vary": "Accept,Accept-Encoding", "Content-Type": "application/json"}},
	}},
	{name: "strict ReplayHeaders", sem: semantics{replayHeaders: []string{"Content-Type", "location"}}, runs: 1, steps: []step{
		{request: post(`{}`, key("k")...), status: 201, has: map[string]string{"X-Charge-Id": "ch_1"}},
		{request: post(`{}`, key("k")...), status: 201, replayed: true,
			has: map[string]string{"Location": "/orders/1", "Content-Type": "application/json"}, lacks: []string{"X-Charge-Id", "Vary", "Set-Cookie"}},
	}},
	{name: "Set-Cookie never replayed", runs: 1, steps: []step{
		{request: post(`{}`, key("k")...), status: 201, has: map[string]string{"Set-Cookie": "session=s1"}},
		{request: post(`{}`, key("k")...), status: 201, replayed: true, lacks: []string{"Set-Cookie"}},
	}},
	{name: "Retry-After from the store", sem: semantics{storeDown: true, retryAfter: 7 * time.Second}, steps: []step{
		{request: post(`{}`, key("k")...), status: 503, problem: idemhttp.ProblemStoreUnavailable, has: map[string]string{"Retry-After": "7"}},
	}},
	{name: "principals never share responses", sem: semantics{principal: true}, runs: 2, steps: []step{
		{request: post(`{}`, key("k", "Authorization", "alice")...), status: 201},
		{request: post(`{}`, key("k", "Authorization", "bob")...), status: 201, has: map[string]string{"X-Charge-Id": "ch_2"}},
		{request: post(`{}`, key("k", "Authorization", "alice")...), status: 201, replayed: true, has: map[string]string{"X-Charge-Id": "ch_1"}},
		{request: post(`{}`, key("k")...), status: 401, problem: idemhttp.ProblemUnauthenticated},
	}},
	{name: "binary response body", app: appSpec{binary: true}, runs: 1, steps: []step{
		{request: post(`{}`, key("k")...), status: 201},
		{request: post(`{}`, key("k")...), status: 201, replayed: true},
	}},
}

// answer is what a client gets, in a form every transport can be compared
// in: header names canonical, repeated values joined with "," (as API
// Gateway joins them), and without Date and Content-Length, which the
// server or API Gateway sets.
type answer struct {
	status int
	header map[string]string
	body   string
}

func answerOf(status int, header http.Header, body []byte) answer {
	a := answer{status: status, header: map[string]string{}, body: string(body)}
	for k, vs := range header {
		if k := http.CanonicalHeaderKey(k); k != "Date" && k != "Content-Length" {
			a.header[k] = strings.Join(vs, ",")
		}
	}
	return a
}

// app is the handler behind every transport.
type app struct {
	spec            appSpec
	runs            atomic.Int64
	inside, release chan struct{}
}

type appResponse struct {
	status int
	header http.Header
	body   []byte
}

func (a *app) serve(body []byte) appResponse {
	n := a.runs.Add(1)
	if a.spec.hold && n == 1 {
		a.inside <- struct{}{}
		<-a.release
	}
	r := appResponse{status: 201, header: http.Header{}}
	if s := a.spec.status; len(s) > 0 {
		r.status = s[min(int(n), len(s))-1]
	}
	r.header.Set("Content-Type", "application/json")
	r.header.Set("Location", fmt.Sprintf("/orders/%d", n))
	r.header.Set("X-Charge-Id", fmt.Sprintf("ch_%d", n))
	r.header.Add("Vary", "Accept")
	r.header.Add("Vary", "Accept-Encoding")
	r.header.Set("Set-Cookie", fmt.Sprintf("session=s%d", n))
	r.body = fmt.Appendf(nil, `{"run":%d,"body":%q}`, n, body)
	if a.spec.binary {
		r.header.Set("Content-Type", "application/octet-stream")
		r.body = append([]byte{0xff, 0x00, byte(n)}, body...)
	}
	return r
}

// proxied is a response as a proxy integration returns it: single and
// multi-value headers (v1), or headers joined with commas and cookies
// apart (v2, Function URLs); a body in base64 when it is not UTF-8.
type proxied struct {
	header  map[string]string
	multi   map[string][]string
	cookies []string
	body    string
	base64  bool
}

func (r appResponse) proxy(multiValue bool) proxied {
	p := proxied{header: map[string]string{}, multi: map[string][]string{}, body: string(r.body)}
	for k, vs := range r.header {
		switch {
		case multiValue && (len(vs) > 1 || k == "Set-Cookie"):
			p.multi[k] = vs
		case k == "Set-Cookie":
			p.cookies = vs
		default:
			p.header[k] = strings.Join(vs, ",")
		}
	}
	if !utf8.Valid(r.body) {
		p.body, p.base64 = base64.StdEncoding.EncodeToString(r.body), true
	}
	return p
}

// fromProxy is what a client of API Gateway gets for a proxy response.
func fromProxy(status int, header map[string]string, multi map[string][]string, cookies []string, body string, isBase64 bool) answer {
	h := http.Header{}
	for k, vs := range multi {
		h[http.CanonicalHeaderKey(k)] = vs
	}
	for k, v := range header {
		if _, ok := h[http.CanonicalHeaderKey(k)]; !ok {
			h.Set(k, v)
		}
	}
	for _, c := range cookies {
		h.Add("Set-Cookie", c)
	}
	b := []byte(body)
	if isBase64 {
		var err error
		if b, err = base64.StdEncoding.DecodeString(body); err != nil {
			b = []byte("undecodable base64: " + body)
		}
	}
	return answerOf(status, h, b)
}

// viaJSON is v after the trip through JSON that Lambda gives events and
// responses: a body that is not UTF-8 does not survive it unless in base64.
func viaJSON[T any](v T) T {
	var out T
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		panic(err)
	}
	return out
}

func principalOf(authorization string) (string, error) {
	if authorization == "" {
		return "", errors.New("no Authorization header")
	}
	return authorization, nil
}

// transport serves a case's app in one way and sends it requests.
type transport struct {
	name   string
	fields bool // carries a header sent twice as two fields
	start  func(t *testing.T, eng *idem.Engine, sem semantics, a *app) func(request) (answer, error)
}

var middleware = transport{name: "idemhttp", fields: true, start: func(t *testing.T, eng *idem.Engine, sem semantics, a *app) func(request) (answer, error) {
	cfg := &idemhttp.Config{Required: sem.required, ReplayHeaders: sem.replayHeaders, FingerprintHeaders: sem.fingerprint, MaxBodyBytes: sem.maxBody,
		MaxResponseBytes: sem.maxResponse, StoreRetryAfter: sem.retryAfter, Logger: quiet}
	if sem.principal {
		cfg.Principal = func(r *http.Request) (string, error) { return principalOf(r.Header.Get("Authorization")) }
	}
	mw, err := idemhttp.New(eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp := a.serve(body)
		for k, vs := range resp.header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
	})))
	t.Cleanup(srv.Close)
	return func(q request) (answer, error) {
		req, err := http.NewRequest(q.method, srv.URL+"/orders?src=web", strings.NewReader(q.body))
		if err != nil {
			return answer{}, err
		}
		for i := 0; i+1 < len(q.header); i += 2 {
			req.Header.Add(q.header[i], q.header[i+1])
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return answerOf(resp.StatusCode, resp.Header, b), err
	}
}}

// config is sem as an adapter's HTTPConfig; principal reads the
// Authorization header from the event.
func config[E any](sem semantics, principal func(E) string) *idemlambda.HTTPConfig[E] {
	c := &idemlambda.HTTPConfig[E]{Config: idemhttp.Config{Required: sem.required, ReplayHeaders: sem.replayHeaders, FingerprintHeaders: sem.fingerprint, MaxBodyBytes: sem.maxBody,
		MaxResponseBytes: sem.maxResponse, StoreRetryAfter: sem.retryAfter, Logger: quiet}}
	if sem.principal {
		c.Principal = func(e E) (string, error) { return principalOf(principal(e)) }
	}
	return c
}

// joined is q's headers as HTTP APIs and Function URLs deliver them: lower
// case, a repeated header joined with commas.
func joined(q request) map[string]string {
	h := map[string]string{}
	for i := 0; i+1 < len(q.header); i += 2 {
		name := strings.ToLower(q.header[i])
		if prev, ok := h[name]; ok {
			h[name] = prev + "," + q.header[i+1]
		} else {
			h[name] = q.header[i+1]
		}
	}
	return h
}

var adapters = []transport{
	{name: "APIGatewayV1", fields: true, start: func(t *testing.T, eng *idem.Engine, sem semantics, a *app) func(request) (answer, error) {
		h, err := idemlambda.APIGatewayV1(eng, "orders", func(ctx context.Context, e events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
			r := a.serve([]byte(e.Body))
			p := r.proxy(true)
			return events.APIGatewayProxyResponse{StatusCode: r.status, Headers: p.header, MultiValueHeaders: p.multi, Body: p.body, IsBase64Encoded: p.base64}, nil
		}, config(sem, func(e events.APIGatewayProxyRequest) string { return e.Headers["Authorization"] }))
		if err != nil {
			t.Fatal(err)
		}
		return func(q request) (answer, error) {
			e := events.APIGatewayProxyRequest{Resource: "/orders", Path: "/orders", HTTPMethod: q.method, Body: q.body,
				Headers: map[string]string{}, MultiValueHeaders: map[string][]string{},
				QueryStringParameters: map[string]string{"src": "web"}, MultiValueQueryStringParameters: map[string][]string{"src": {"web"}}}
			for i := 0; i+1 < len(q.header); i += 2 {
				name := q.header[i]
				e.Headers[name] = q.header[i+1] // the last one, as API Gateway gives it
				e.MultiValueHeaders[name] = append(e.MultiValueHeaders[name], q.header[i+1])
			}
			r, err := h(context.Background(), viaJSON(e))
			r = viaJSON(r)
			return fromProxy(r.StatusCode, r.Headers, r.MultiValueHeaders, nil, r.Body, r.IsBase64Encoded), err
		}
	}},
	{name: "APIGatewayV2", start: func(t *testing.T, eng *idem.Engine, sem semantics, a *app) func(request) (answer, error) {
		h, err := idemlambda.APIGatewayV2(eng, "orders", func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
			in, err := base64.StdEncoding.DecodeString(e.Body)
			if err != nil {
				return events.APIGatewayV2HTTPResponse{}, err
			}
			r := a.serve(in)
			p := r.proxy(false)
			return events.APIGatewayV2HTTPResponse{StatusCode: r.status, Headers: p.header, Cookies: p.cookies, Body: p.body, IsBase64Encoded: p.base64}, nil
		}, config(sem, func(e events.APIGatewayV2HTTPRequest) string { return e.Headers["authorization"] }))
		if err != nil {
			t.Fatal(err)
		}
		return func(q request) (answer, error) {
			e := events.APIGatewayV2HTTPRequest{RouteKey: "POST /orders", RawPath: "/orders", RawQueryString: "src=web", Headers: joined(q),
				Body: base64.StdEncoding.EncodeToString([]byte(q.body)), IsBase64Encoded: true}
			e.RequestContext.HTTP.Method = q.method
			r, err := h(context.Background(), viaJSON(e))
			r = viaJSON(r)
			return fromProxy(r.StatusCode, r.Headers, nil, r.Cookies, r.Body, r.IsBase64Encoded), err
		}
	}},
	{name: "FunctionURL", start: func(t *testing.T, eng *idem.Engine, sem semantics, a *app) func(request) (answer, error) {
		h, err := idemlambda.FunctionURL(eng, "orders", func(ctx context.Context, e events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
			r := a.serve([]byte(e.Body))
			p := r.proxy(false)
			return events.LambdaFunctionURLResponse{StatusCode: r.status, Headers: p.header, Cookies: p.cookies, Body: p.body, IsBase64Encoded: p.base64}, nil
		}, config(sem, func(e events.LambdaFunctionURLRequest) string { return e.Headers["authorization"] }))
		if err != nil {
			t.Fatal(err)
		}
		return func(q request) (answer, error) {
			e := events.LambdaFunctionURLRequest{RawPath: "/orders", RawQueryString: "src=web", Headers: joined(q), Body: q.body}
			e.RequestContext.HTTP.Method = q.method
			r, err := h(context.Background(), viaJSON(e))
			r = viaJSON(r)
			return fromProxy(r.StatusCode, r.Headers, nil, r.Cookies, r.Body, r.IsBase64Encoded), err
		}
	}},
}

// t0 is the engine clock's time: it stands still, so Retry-After is exact.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// run sends the steps of c through tr, each transport with an engine of its
// own, and returns the answers in step order and how often the handler ran.
func run(t *testing.T, c httpCase, tr transport) ([]answer, int64) {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	fs := faultstore.New(mem)
	if c.sem.storeDown {
		fs.FailAlways("claim", fmt.Errorf("%w: connection refused", store.ErrUnavailable))
	}
	eng, err := idem.New(fs, &idem.Config{Clock: clocktest.New(t0), RenewInterval: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{spec: c.app, inside: make(chan struct{}, 1), release: make(chan struct{})}
	send := tr.start(t, eng, c.sem, a)
	type result struct {
		i   int
		ans answer
		err error
	}
	answers := make([]answer, len(c.steps))
	held := make(chan result, len(c.steps))
	pending := 0
	for i, s := range c.steps {
		if !s.held {
			ans, err := send(s.request)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			answers[i] = ans
			continue
		}
		pending++
		go func() { ans, err := send(s.request); held <- result{i, ans, err} }()
		select {
		case <-a.inside:
		case r := <-held:
			t.Fatalf("step %d answered %+v, %v without reaching the handler", i, r.ans, r.err)
		case <-time.After(10 * time.Second): // a guard, not a wait for something to happen
			t.Fatalf("step %d never reached the handler", i)
		}
	}
	close(a.release)
	for range pending {
		r := <-held
		if r.err != nil {
			t.Fatalf("step %d: %v", r.i, r.err)
		}
		answers[r.i] = r.ans
	}
	return answers, a.runs.Load()
}

// check holds the middleware's answers to what the case says.
func (c httpCase) check(t *testing.T, answers []answer, runs int64) {
	t.Helper()
	for i, s := range c.steps {
		a := answers[i]
		if a.status != s.status || (a.header[idemhttp.ReplayedHeader] == "true") != s.replayed {
			t.Errorf("step %d: status %d, replayed %q; want %d, replayed %v (%s)", i, a.status, a.header[idemhttp.ReplayedHeader], s.status, s.replayed, a.body)
		}
		if s.problem != "" {
			var p idemhttp.Problem
			if a.header["Content-Type"] != "application/problem+json" || json.Unmarshal([]byte(a.body), &p) != nil ||
				p.Type != idemhttp.ProblemTypeBase+s.problem || p.Status != s.status {
				t.Errorf("step %d: want problem %s, got %v %s", i, s.problem, a.header, a.body)
			}
		}
		for name, want := range s.has {
			if got := a.header[name]; got != want {
				t.Errorf("step %d: %s is %q, want %q", i, name, got, want)
			}
		}
		for _, name := range s.lacks {
			if got, ok := a.header[name]; ok {
				t.Errorf("step %d: %s is %q, want none", i, name, got)
			}
		}
	}
	if runs != c.runs {
		t.Errorf("the handler ran %d times, want %d", runs, c.runs)
	}
}

func TestHTTPAdaptersAnswerAsTheMiddleware(t *testing.T) {
	t.Parallel()
	for _, c := range httpCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			want, runs := run(t, c, middleware)
			c.check(t, want, runs)
			for _, tr := range adapters {
				t.Run(tr.name, func(t *testing.T) {
					t.Parallel()
					if c.fields && !tr.fields {
						t.Skip("its events join a repeated header into one field: that is the case \"two keys in one field\"")
					}
					got, gotRuns := run(t, c, tr)
					for i := range want {
						if !reflect.DeepEqual(got[i], want[i]) {
							t.Errorf("step %d:\n got %+v\nwant %+v (idemhttp)", i, got[i], want[i])
						}
					}
					if gotRuns != runs {
						t.Errorf("the handler ran %d times, %d behind idemhttp", gotRuns, runs)
					}
				})
			}
		})
	}
}
