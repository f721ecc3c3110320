package idemhttp_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

// stall sends a covered request to addr whose body stops after 3 of its
// 10 bytes, and returns the answer and whether the server closed the
// connection after it. The 10s read deadline is a failure guard only.
func stall(t *testing.T, addr, key string) (reply, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: 10\r\n\r\n{\"a", key)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, br)
	return reply{resp.StatusCode, resp.Header, string(b)}, n == 0 && err == nil
}

// TestStalledBodyIs408BeforeAnyClaim: a body that stops arriving is cut off
// by Config.BodyTimeout (or by the server's ReadTimeout when that is not
// set) and answered 408; nothing is claimed, the handler does not run, the
// connection is closed, and the key stays free for the real request.
func TestStalledBodyIs408BeforeAnyClaim(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mcfg          *idemhttp.Config
		serverTimeout time.Duration
		detail        string
	}{
		"BodyTimeout":        {mcfg: &idemhttp.Config{BodyTimeout: 50 * time.Millisecond}, detail: "within 50ms"},
		"server ReadTimeout": {mcfg: &idemhttp.Config{}, serverTimeout: 50 * time.Millisecond, detail: "in time"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{}, tc.mcfg, created)
			addr := en.srv.Listener.Addr().String()
			if tc.serverTimeout > 0 {
				srv := httptest.NewUnstartedServer(en.srv.Config.Handler)
				srv.Config.ReadTimeout = tc.serverTimeout
				srv.Start()
				t.Cleanup(srv.Close)
				addr = srv.Listener.Addr().String()
			}
			r, closed := stall(t, addr, "stalled")
			p := problem(t, r, http.StatusRequestTimeout, idemhttp.ProblemBodyTimeout)
			if !strings.Contains(p.Detail, tc.detail) || p.Instance != "/orders" {
				t.Errorf("problem %+v", p)
			}
			if !closed {
				t.Error("the connection was left open after the 408")
			}
			if en.store.Total() != 0 || en.runs.Load() != 0 {
				t.Fatalf("%d store calls, handler ran %d times", en.store.Total(), en.runs.Load())
			}
			if r := en.do(t, "POST", "/orders", `{"a":1}`, "Idempotency-Key", "stalled"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("the real request after the 408: %+v", r)
			}
		})
	}
}

// trickle is a body that moves the clock on by step before each byte it
// gives, as if each byte took that long to arrive.
type trickle struct {
	advance func(time.Duration)
	step    time.Duration
	data    []byte
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	r.advance(r.step)
	p[0], r.data = r.data[0], r.data[1:]
	return 1, nil
}

// TestTricklingBodyIs408BeforeAnyClaim: where the ResponseWriter cannot set
// a read deadline (a recorder here), a body that keeps trickling in is
// still cut off once BodyTimeout has passed on the engine's clock; one that
// arrives in time is served.
func TestTricklingBodyIs408BeforeAnyClaim(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, &idemhttp.Config{BodyTimeout: 10 * time.Second}, created)
	h := en.srv.Config.Handler
	serve := func(key string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/orders", &trickle{advance: en.clock.Advance, step: time.Second, data: body})
		req.ContentLength = int64(len(body))
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}

	w := serve("slow", bytes.Repeat([]byte("x"), 30)) // 30s for 30 bytes
	problem(t, reply{w.Code, w.Header(), w.Body.String()}, http.StatusRequestTimeout, idemhttp.ProblemBodyTimeout)
	if en.store.Total() != 0 || en.runs.Load() != 0 {
		t.Fatalf("%d store calls, handler ran %d times", en.store.Total(), en.runs.Load())
	}
	if w := serve("in-time", []byte(`{"a":1}`)); w.Code != 201 || en.runs.Load() != 1 { // 7s for 7 bytes
		t.Fatalf("a body within the deadline: %d %s", w.Code, w.Body)
	}
}

func TestProblemForBodyTimeout(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wrapped: %w", &idemhttp.BodyTimeoutError{Timeout: 30 * time.Second, Err: os.ErrDeadlineExceeded})
	p := idemhttp.ProblemFor(err, t0, time.Second)
	if p.Status != 408 || p.Type != idemhttp.ProblemTypeBase+idemhttp.ProblemBodyTimeout || !strings.Contains(p.Detail, "30s") || p.RetryAfter != 0 {
		t.Fatalf("%+v", p)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("BodyTimeoutError does not unwrap to its read error")
	}
}
