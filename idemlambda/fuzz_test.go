package idemlambda_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// FuzzWrapRaw sends arbitrary events through a wrapped handler keyed by
// a JMESPath expression that parses a JSON body, twice: the handler runs at
// most once per event, a second call returns the same bytes, and a bad
// event is an error, never a panic. A JSON event fails only for want of a
// key, on the expression, or when the selected key has no canonical form
// (idem.ErrInvalidPayload: an exponent of a billion, nesting deeper than
// canonical.MaxDepth) — never on a number beyond float64's range
// (testdata/fuzz/FuzzWrapRaw).
func FuzzWrapRaw(f *testing.F) {
	for _, s := range []string{`{"body":"{\"id\":1}"}`, `{"body":"not json"}`, `{"body":null}`, `[]`, `"x"`, `{"body":"{\"id\":[null]}"}`,
		`{"body":"{\"id\":9007199254740993}"}`, `{"body":"{\"id\":1e1000000000}"}`} {
		f.Add([]byte(s))
	}
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	runs := 0
	h, err := idemlambda.WrapRaw(eng, "fuzz", func(ctx context.Context, p []byte) ([]byte, error) {
		runs++
		return json.Marshal(runs)
	}, &idemlambda.Config{KeyJMESPath: "powertools_json(body).id", RaiseOnMissingKey: true, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, event []byte) {
		before := runs
		a, err := h.Invoke(context.Background(), event)
		if err != nil {
			if runs != before {
				t.Fatalf("handler ran and the call failed: %v", err)
			}
			var ee *idemlambda.ExprError
			if !errors.Is(err, idemlambda.ErrMissingKey) && !errors.As(err, &ee) && !errors.Is(err, idem.ErrInvalidPayload) && json.Valid(event) {
				t.Fatalf("unexpected error for a JSON event: %v", err)
			}
			return
		}
		b, err := h.Invoke(context.Background(), event)
		if err != nil || string(a) != string(b) || runs > before+1 {
			t.Fatalf("second call: %s %v (first %s), runs %d→%d", b, err, a, before, runs)
		}
	})
}

// FuzzHTTPAdapter sends arbitrary requests, twice each, through idemhttp's
// middleware and through the API Gateway v2 adapter (events and responses
// through JSON, as Lambda carries them): the adapter never panics, and
// gives the middleware's answers (status, headers, body) every time.
func FuzzHTTPAdapter(f *testing.F) {
	f.Add("POST", `"k"`, []byte(`{}`), "a=1", false)
	f.Add("PATCH", `k k`, []byte{}, "", true)
	f.Add("POST", `"\"`, []byte{0xff, 0xfe}, "%zz", true)
	f.Add("post", "k", []byte("x"), "b=%20&a", false)
	f.Add("GET", "", []byte("y"), "", false)
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Logger: quiet, RenewInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	echo := func(status int, body []byte) appResponse {
		h := http.Header{}
		h.Set("Content-Type", "application/octet-stream")
		h.Set("X-Size", strconv.Itoa(len(body)))
		return appResponse{status: status, header: h, body: body}
	}
	mw, err := idemhttp.New(eng, &idemhttp.Config{Operation: "fuzz-http", MaxBodyBytes: 64, Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	direct := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp := echo(201, body)
		maps.Copy(w.Header(), resp.header)
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
	}))
	v2, err := idemlambda.APIGatewayV2(eng, "fuzz-v2", func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		p := echo(201, decodeEventBody(e.Body, e.IsBase64Encoded)).proxy(false)
		return events.APIGatewayV2HTTPResponse{StatusCode: 201, Headers: p.header, Body: p.body, IsBase64Encoded: p.base64}, nil
	}, &idemlambda.HTTPConfig[events.APIGatewayV2HTTPRequest]{Config: idemhttp.Config{MaxBodyBytes: 64, Logger: quiet}})
	if err != nil {
		f.Fatal(err)
	}
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, method, key string, body []byte, query string, isBase64 bool) {
		if method != "POST" && method != "PATCH" && method != "GET" && method != "post" {
			method = "POST"
		}
		path := fmt.Sprintf("/f/%d", seq.Add(1)) // a fresh key space per input
		viaMiddleware := func() answer {
			u := &url.URL{Path: path, RawQuery: query}
			r := (&http.Request{Method: method, URL: u, RequestURI: u.RequestURI(), Header: http.Header{},
				Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}).WithContext(context.Background())
			if key != "" {
				r.Header.Set("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			direct.ServeHTTP(w, r)
			return answerOf(w.Code, w.Result().Header, w.Body.Bytes())
		}
		viaV2 := func() answer {
			e := events.APIGatewayV2HTTPRequest{RouteKey: "ANY " + path, RawPath: path, RawQueryString: query, Headers: map[string]string{}, Body: string(body)}
			if isBase64 {
				e.Body, e.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
			}
			if key != "" {
				e.Headers["idempotency-key"] = key
			}
			e.RequestContext.HTTP.Method = method
			r, err := v2(context.Background(), viaJSON(e))
			if err != nil {
				t.Fatalf("adapter: %v", err)
			}
			r = viaJSON(r)
			return fromProxy(r.StatusCode, r.Headers, nil, r.Cookies, r.Body, r.IsBase64Encoded)
		}
		// Text that is not UTF-8 does not survive the event's JSON (a body
		// does in base64): there is no such event to compare, only one that
		// must not break the adapter.
		comparable := (isBase64 || utf8.Valid(body)) && utf8.ValidString(key) && utf8.ValidString(query)
		for i := range 2 {
			want, got := viaMiddleware(), viaV2()
			if comparable && !reflect.DeepEqual(got, want) {
				t.Fatalf("request %d:\n got %+v\nwant %+v (idemhttp)", i+1, got, want)
			}
		}
	})
}

func decodeEventBody(body string, isBase64 bool) []byte {
	if !isBase64 {
		return []byte(body)
	}
	b, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		panic(err)
	}
	return b
}
