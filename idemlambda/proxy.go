package idemlambda

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// proxyRequest is what the HTTP adapters read from an event.
type proxyRequest struct {
	method, route     string
	rawPath, rawQuery string
	header            http.Header
	body              string
	base64            bool
}

// httpRequest is the request as a server would have received it.
func (p proxyRequest) httpRequest(ctx context.Context) *http.Request {
	u := &url.URL{Path: p.rawPath, RawQuery: p.rawQuery}
	if path, err := url.PathUnescape(p.rawPath); err == nil {
		u.Path, u.RawPath = path, p.rawPath
	}
	body := decodeBody(p.body, p.base64)
	r := &http.Request{
		Method: p.method, URL: u, RequestURI: u.RequestURI(),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: p.header, Host: p.header.Get("Host"),
		Body: http.NoBody, ContentLength: int64(len(body)),
	}
	if len(body) > 0 {
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return r.WithContext(ctx)
}

// requestHeader merges an event's headers: the multi-value form wins for
// a name in both (as API Gateway does). Cookies, which payload format 2.0
// sends apart, go back into a Cookie header.
func requestHeader(multi map[string][]string, single map[string]string, cookies []string) http.Header {
	h := make(http.Header, len(multi)+len(single)+1)
	for k, vs := range multi {
		ck := http.CanonicalHeaderKey(k)
		h[ck] = append(h[ck], vs...)
	}
	for k, v := range single {
		if ck := http.CanonicalHeaderKey(k); h[ck] == nil {
			h[ck] = []string{v}
		}
	}
	if len(cookies) > 0 {
		h.Set("Cookie", strings.Join(cookies, "; "))
	}
	return h
}

// proxyResponse is what the HTTP adapters' response types hold.
type proxyResponse struct {
	status  int
	header  map[string]string
	multi   map[string][]string
	cookies []string
	body    string
	base64  bool
}

// write sends a handler's response to w. As in requestHeader, the
// multi-value form wins for a name in both.
func (p proxyResponse) write(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range p.multi {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	for k, v := range p.header {
		if ck := http.CanonicalHeaderKey(k); h[ck] == nil {
			h[ck] = []string{v}
		}
	}
	for _, c := range p.cookies {
		h.Add("Set-Cookie", c)
	}
	w.WriteHeader(p.status)
	_, _ = w.Write(decodeBody(p.body, p.base64))
}

// decodeBody returns an event's body as bytes; one that claims to be base64
// and is not is taken as it is.
func decodeBody(body string, isBase64 bool) []byte {
	if isBase64 {
		if b, err := base64.StdEncoding.DecodeString(body); err == nil {
			return b
		}
	}
	return []byte(body)
}

// recorder is the http.ResponseWriter the middleware answers into. Once the
// handler runs, the handler's own response is returned instead, and what
// is written is discarded.
type recorder struct {
	header  http.Header
	status  int
	body    bytes.Buffer
	discard bool
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.discard {
		return len(p), nil
	}
	return w.body.Write(p)
}

// response is what the middleware answered, as a proxy response: repeated
// headers joined with commas, Content-Length left to the proxy, a body
// that is not UTF-8 in base64.
func (w *recorder) response() proxyResponse {
	p := proxyResponse{status: w.status, header: make(map[string]string, len(w.header))}
	if p.status == 0 {
		p.status = http.StatusOK
	}
	for k, vs := range w.header {
		if k != "Content-Length" && len(vs) > 0 {
			p.header[k] = strings.Join(vs, ",")
		}
	}
	if b := w.body.Bytes(); utf8.Valid(b) {
		p.body = string(b)
	} else {
		p.body, p.base64 = base64.StdEncoding.EncodeToString(b), true
	}
	return p
}
