package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// TestWaitingAnswersCoveredRequests503 serves requests from a gateway
// whose store is not open: what the middleware would cover gets 503 with
// Retry-After and never reaches the upstream; anything else is passed
// through, as it would be with the store open.
func TestWaitingAnswersCoveredRequests503(t *testing.T) {
	up := newUpstream(t)
	for _, required := range []bool{false, true} {
		o, err := parseFlags([]string{"-upstream", up.srv.URL, "-store", "memory:", "-admin", "127.0.0.1:0",
			"-status-path", "/idempotency/status/", "-require-key=" + fmt.Sprint(required)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		g, err := newPending(o, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		before := up.total.Load()
		for _, c := range []struct {
			method, path, key string
			want              int // 0: passed through
		}{
			{"POST", "/orders", "k1", 503},
			{"PATCH", "/orders/1", "k2", 503},
			{"GET", "/idempotency/status/abc", "", 503},
			{"GET", "/orders", "", 0},
			{"PUT", "/orders/1", "k3", 0}, // not a covered method
			{"POST", "/orders", "", map[bool]int{false: 0, true: 503}[required]},
		} {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(`{}`))
			if c.key != "" {
				req.Header.Set("Idempotency-Key", c.key)
			}
			w := httptest.NewRecorder()
			g.handler.ServeHTTP(w, req)
			passed := up.total.Load() > before
			before = up.total.Load()
			switch {
			case c.want == 503 && (w.Code != 503 || passed || w.Header().Get("Retry-After") != "1" ||
				!strings.Contains(w.Body.String(), "store-unavailable")):
				t.Errorf("required=%v %s %s key %q: %d %s (upstream reached: %v), want 503 store-unavailable with Retry-After",
					required, c.method, c.path, c.key, w.Code, w.Body, passed)
			case c.want == 0 && !passed:
				t.Errorf("required=%v %s %s key %q: %d, want it passed through", required, c.method, c.path, c.key, w.Code)
			}
		}
		admin := g.adminHandler()
		for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
			w := httptest.NewRecorder()
			admin.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
			if w.Code != want {
				t.Errorf("%s while waiting: %d %s, want %d", path, w.Code, w.Body, want)
			}
		}
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, httptest.NewRequest("POST", "/idem/v1/tokens/x/complete", nil))
		if w.Code != 503 {
			t.Errorf("token endpoint while waiting: %d %s, want 503", w.Code, w.Body)
		}
	}
}

// TestGatewayWaitsForItsStore starts a gateway while its store (Redis,
// then PostgreSQL, which the gateway migrates once it is up) is down:
// the gateway listens at once, /healthz answers 200, /readyz and covered
// requests 503 without reaching the upstream; once the store is up within
// -store-wait, the gateway serves.
func TestGatewayWaitsForItsStore(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			addr, via := sharedStore(t, kind)
			px, err := faultproxy.New(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer px.Close()
			px.Down()
			up := newUpstream(t)
			start := time.Now()
			gw := startListening(t, "-upstream", up.srv.URL, "-store", via(px.Addr()), "-admin", "127.0.0.1:0", "-store-wait", "60s")
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("listening took %v with the store down", d)
			}
			if h := send("GET", "http://"+gw.admin+"/healthz", ""); h.status != 200 {
				t.Errorf("healthz while waiting: %+v", h)
			}
			// A probe's answer: no advice for a client with a key.
			if h := send("GET", "http://"+gw.admin+"/readyz", ""); h.status != 503 || h.problemType() != "store-unavailable" ||
				!strings.Contains(h.body, "not ready: the gateway is waiting for its store") || strings.Contains(h.body, "Idempotency-Key") {
				t.Errorf("readyz while waiting: %+v", h)
			}
			for i := range 3 {
				a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "early")
				if a.status != 503 || a.problemType() != "store-unavailable" || a.header.Get("Retry-After") == "" {
					t.Fatalf("covered request %d while waiting: %+v", i, a)
				}
			}
			if n := up.total.Load(); n != 0 {
				t.Fatalf("the upstream ran %d requests while the store was not open", n)
			}
			time.Sleep(3 * time.Second) // attempts fail
			if err := px.Up(); err != nil {
				t.Fatal(err)
			}
			var r answer
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if r = send("GET", "http://"+gw.admin+"/readyz", ""); r.status == 200 {
					break
				}
			}
			if r.status != 200 || r.body != "ready\n" {
				t.Fatalf("readyz once the store is up: %+v\n%s", r, gw.logs)
			}
			a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "early")
			b := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "early")
			if a.status != 201 || b.status != 201 || !b.replayed() || up.count("early") != 1 {
				t.Fatalf("once open: %+v, %+v, upstream ran %d", a, b, up.count("early"))
			}
			logs := gw.logs.String()
			if !strings.Contains(logs, "store not open yet") || !strings.Contains(logs, "store open; serving covered requests") {
				t.Errorf("logs lack the retries or the opening:\n%s", logs)
			}
			// Every line is the gateway's JSON, go-redis's own among them.
			if kind == "redis" && !strings.Contains(logs, `"msg":"go-redis"`) {
				t.Errorf("go-redis's failed dials are not in the gateway's log:\n%s", logs)
			}
			for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
				if !json.Valid([]byte(line)) {
					t.Errorf("a log line that is not JSON: %q", line)
				}
			}
		})
	}
}

// TestGatewayExitsWhenTheStoreWaitIsOver: a store down for longer than
// -store-wait makes the gateway exit (status 2) with a message saying so
// and what to do, not before.
func TestGatewayExitsWhenTheStoreWaitIsOver(t *testing.T) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	px.Down()
	up := newUpstream(t)
	start := time.Now()
	gw := startListening(t, "-upstream", up.srv.URL, "-store", "redis://"+px.Addr()+"/0", "-store-wait", "3s")
	err = gw.wait()
	took := time.Since(start)
	if ee, ok := err.(interface{ ExitCode() int }); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v\n%s", err, gw.logs)
	}
	if took < 3*time.Second || took > 20*time.Second {
		t.Errorf("exited after %v with -store-wait 3s", took)
	}
	logs := gw.logs.String()
	for _, want := range []string{"did not open within 3s", "raise -store-wait"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the exit message lacks %q:\n%s", want, logs)
		}
	}
}

// TestGatewayExitsAtOnceOnAStoreConfigurationFault: a fault no wait mends
// (here a table name PostgreSQL cannot have) ends the gateway at once,
// whatever -store-wait.
func TestGatewayExitsAtOnceOnAStoreConfigurationFault(t *testing.T) {
	addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	up := newUpstream(t)
	start := time.Now()
	gw := startListening(t, "-upstream", up.srv.URL, "-store", fmt.Sprintf("postgres://%s@%s/test?table=a.b.c", pgUser(), addr), "-store-wait", "60s")
	err := gw.wait()
	if ee, ok := err.(interface{ ExitCode() int }); !ok || ee.ExitCode() != 2 || time.Since(start) > 15*time.Second {
		t.Fatalf("exit after %v: %v\n%s", time.Since(start), err, gw.logs)
	}
	if logs := gw.logs.String(); !strings.Contains(logs, "no retry") || !strings.Contains(logs, "more than schema.name") {
		t.Errorf("the exit message:\n%s", logs)
	}
}

// TestSIGTERMWhileWaitingForTheStore: a gateway stopped while it waits
// exits cleanly and at once.
func TestSIGTERMWhileWaitingForTheStore(t *testing.T) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	px.Down()
	up := newUpstream(t)
	gw := startListening(t, "-upstream", up.srv.URL, "-store", "redis://"+px.Addr()+"/0", "-store-wait", "60s")
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := gw.wait(); err != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("after SIGTERM: %v in %v\n%s", err, time.Since(start), gw.logs)
	}
}
