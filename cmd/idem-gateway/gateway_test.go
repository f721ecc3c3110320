package main

import (
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

func TestGatewayAnswers(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-max-body", "1KiB", "-store", "bolt://"+t.TempDir()+"/gw.db")

	t.Run("replay", func(t *testing.T) {
		first := send("POST", gw.url("/orders"), `{"amount":10}`, "Idempotency-Key", `"replay-1"`)
		if first.status != 201 || first.replayed() || first.header.Get("Set-Cookie") == "" {
			t.Fatalf("first: %+v", first)
		}
		again := send("POST", gw.url("/orders"), `{"amount":10}`, "Idempotency-Key", `"replay-1"`)
		if again.status != 201 || !again.replayed() || again.body != first.body || again.header.Get("Location") != `/orders/"replay-1"` ||
			again.header.Get("X-Upstream-Private") != "internal" {
			t.Fatalf("replay: %+v", again)
		}
		for _, h := range []string{"Set-Cookie", "Www-Authenticate", "Proxy-Authenticate"} {
			if v := again.header.Get(h); v != "" {
				t.Errorf("replay carries %s: %q", h, v)
			}
		}
		if n := up.count(`"replay-1"`); n != 1 {
			t.Fatalf("upstream ran %d times", n)
		}
	})
	t.Run("strict -replay-headers", func(t *testing.T) {
		strict := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-replay-headers", "Content-Type, location")
		send("POST", strict.url("/orders"), `{}`, "Idempotency-Key", "strict-1")
		again := send("POST", strict.url("/orders"), `{}`, "Idempotency-Key", "strict-1")
		if !again.replayed() || again.header.Get("Content-Type") != "application/json" || again.header.Get("Location") != "/orders/strict-1" {
			t.Fatalf("replay: %+v", again)
		}
		for _, h := range []string{"Set-Cookie", "Www-Authenticate", "Proxy-Authenticate", "X-Upstream-Private"} {
			if v := again.header.Get(h); v != "" {
				t.Errorf("replay carries %s: %q", h, v)
			}
		}
	})
	t.Run("422", func(t *testing.T) {
		send("POST", gw.url("/orders"), `{"amount":10}`, "Idempotency-Key", "reuse")
		a := send("POST", gw.url("/orders"), `{"amount":99}`, "Idempotency-Key", "reuse")
		if a.status != 422 || a.problemType() != "key-reused" || up.count("reuse") != 1 {
			t.Fatalf("%+v, upstream ran %d", a, up.count("reuse"))
		}
	})
	t.Run("400", func(t *testing.T) {
		for _, h := range [][]string{
			{"Idempotency-Key", `"open`},
			{"Idempotency-Key", "a", "Idempotency-Key", "b"},
			{"Idempotency-Key", strings.Repeat("k", 256)},
		} {
			a := send("POST", gw.url("/orders"), `{}`, h...)
			if a.status != 400 || a.problemType() != "invalid-key" {
				t.Errorf("%q: %+v", h, a)
			}
		}
	})
	t.Run("413", func(t *testing.T) {
		a := send("POST", gw.url("/orders"), strings.Repeat("x", 1025), "Idempotency-Key", "big")
		if a.status != 413 || a.problemType() != "body-too-large" || up.count("big") != 0 {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("uncovered", func(t *testing.T) {
		send("GET", gw.url("/orders"), "", "Idempotency-Key", "get")
		send("GET", gw.url("/orders"), "", "Idempotency-Key", "get")
		if up.count("get") != 2 {
			t.Fatalf("GET ran %d times", up.count("get"))
		}
	})
	t.Run("429, 408 and 425 release", func(t *testing.T) {
		for _, code := range []string{"429", "408", "425"} {
			key := "busy-" + code
			if a := send("POST", gw.url("/busy/"+code), "", "Idempotency-Key", key); a.status != atoi(code) || a.replayed() {
				t.Fatalf("%s first: %+v", code, a)
			}
			a := send("POST", gw.url("/busy/"+code), "", "Idempotency-Key", key)
			if a.status != 201 || a.replayed() || up.count(key) != 2 {
				t.Fatalf("%s: the retry goes upstream: %+v, upstream ran %d", code, a, up.count(key))
			}
			if a := send("POST", gw.url("/busy/"+code), "", "Idempotency-Key", key); a.status != 201 || !a.replayed() || up.count(key) != 2 {
				t.Fatalf("%s: the 201 is stored: %+v, upstream ran %d", code, a, up.count(key))
			}
		}
	})
	t.Run("5xx releases", func(t *testing.T) {
		send("POST", gw.url("/fail"), "", "Idempotency-Key", "fail")
		a := send("POST", gw.url("/fail"), "", "Idempotency-Key", "fail")
		if a.status != 500 || a.replayed() || up.count("fail") != 2 {
			t.Fatalf("%+v, upstream ran %d", a, up.count("fail"))
		}
	})
}

func TestConcurrentDuplicatesReachTheUpstreamOnce(t *testing.T) {
	up := newUpstream(t)
	for _, wait := range []string{"0s", "30s"} {
		t.Run("wait="+wait, func(t *testing.T) {
			gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-wait", wait)
			key := "dup-" + wait
			release := up.holdAll()
			defer release()
			const n = 64
			answers := make(chan answer, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() { answers <- send("POST", gw.url("/orders"), `{"a":1}`, "Idempotency-Key", key) })
			}
			<-up.arrived
			if wait == "0s" {
				// Every duplicate is answered while the first is held.
				for range n - 1 {
					if a := <-answers; a.status != 409 || a.problemType() != "in-progress" || a.header.Get("Retry-After") == "" {
						t.Errorf("duplicate: %+v", a)
					}
				}
			}
			release()
			wg.Wait()
			close(answers)
			for a := range answers {
				if a.status != 201 {
					t.Errorf("answer %+v", a)
				}
			}
			if got := up.count(key); got != 1 {
				t.Fatalf("upstream ran %d times for %d concurrent duplicates", got, n)
			}
		})
	}
}

func TestPrincipalsAreIsolated(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-principal-header", "Authorization", "-require-key")
	alice := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "shared", "Authorization", "Bearer alice")
	bob := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "shared", "Authorization", "Bearer bob")
	if alice.status != 201 || bob.status != 201 || bob.replayed() || !strings.Contains(bob.body, "Bearer bob") {
		t.Fatalf("alice %+v\nbob %+v", alice, bob)
	}
	again := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "shared", "Authorization", "Bearer alice")
	if !again.replayed() || again.body != alice.body || strings.Contains(again.body, "bob") {
		t.Fatalf("alice's replay: %+v", again)
	}
	if n := up.count("shared"); n != 2 {
		t.Fatalf("upstream ran %d times, want once per principal", n)
	}
	if a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "shared"); a.status != 401 {
		t.Fatalf("no principal: %+v", a)
	}
	if a := send("POST", gw.url("/orders"), `{}`, "Authorization", "Bearer alice"); a.status != 400 || a.problemType() != "missing-key" {
		t.Fatalf("no key with -require-key: %+v", a)
	}
}

func TestUpstreamDownReleasesTheKey(t *testing.T) {
	up := newUpstream(t)
	// The upstream behind a TCP proxy that can stop listening: while it is
	// down, connections are refused.
	px, err := faultproxy.New(strings.TrimPrefix(up.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	gw := startGateway(t, "-upstream", "http://"+px.Addr(), "-store", "memory:")
	px.Down()
	a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "down")
	if a.status != 502 || a.problemType() != "upstream-unreachable" || a.header.Get("Retry-After") != "1" {
		t.Fatalf("%+v", a)
	}
	// The key was released: once the upstream is back, the retry runs.
	if err := px.Up(); err != nil {
		t.Fatal(err)
	}
	if a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "down"); a.status != 201 || a.replayed() || up.count("down") != 1 {
		t.Fatalf("retry after the upstream came back: %+v", a)
	}
}

func TestUpstreamTimeoutKeepsTheKeyHeld(t *testing.T) {
	up := newUpstream(t)
	release := up.holdAll()
	defer release()
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-upstream-timeout", "300ms", "-lease", "1h")
	a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "slow")
	if a.status != 504 || a.problemType() != "upstream-timeout" {
		t.Fatalf("%+v", a)
	}
	release()
	// The upstream may have acted: the retry is held off, not sent.
	b := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "slow")
	if b.status != 409 || b.problemType() != "in-progress" || up.count("slow") != 1 {
		t.Fatalf("retry after a timeout: %+v, upstream ran %d", b, up.count("slow"))
	}
}

// TestNoRetryOnADroppedConnection: the upstream reads the request and
// closes a kept-alive connection without answering. net/http's Transport
// would send a request carrying Idempotency-Key again on a new connection;
// the gateway must not.
func TestNoRetryOnADroppedConnection(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-lease", "1h")
	send("GET", gw.url("/warm"), "") // opens the kept-alive connection
	a := send("POST", gw.url("/close"), "", "Idempotency-Key", "dropped")
	if a.status != 502 || a.problemType() != "upstream-failed" {
		t.Fatalf("%+v", a)
	}
	if n := up.count("dropped"); n != 1 {
		t.Fatalf("the request reached the upstream %d times", n)
	}
	if b := send("POST", gw.url("/close"), "", "Idempotency-Key", "dropped"); b.status != 409 {
		t.Fatalf("retry after a dropped connection: %+v", b)
	}
}

func TestStoreDownIs503WithNoExecution(t *testing.T) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	up := newUpstream(t)
	prefix := fmt.Sprintf("gwtest-%d:", time.Now().UnixNano())
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "redis://"+px.Addr()+"/0?prefix="+prefix, "-admin", "127.0.0.1:0")
	if a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "before"); a.status != 201 {
		t.Fatalf("%+v", a)
	}
	if h := send("GET", "http://"+gw.admin+"/readyz", ""); h.status != 200 {
		t.Fatalf("readyz with the store up: %+v", h)
	}
	px.Down()
	for i := range 2 {
		a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", fmt.Sprintf("down-%d", i))
		if a.status != 503 || a.problemType() != "store-unavailable" || a.header.Get("Retry-After") == "" {
			t.Fatalf("store down: %+v", a)
		}
	}
	if h := send("GET", "http://"+gw.admin+"/readyz", ""); h.status != 503 || !strings.Contains(h.body, "not ready: the store does not answer") ||
		strings.Contains(h.body, "Idempotency-Key") {
		t.Fatalf("readyz with the store down: %+v", h)
	}
	if h := send("GET", "http://"+gw.admin+"/healthz", ""); h.status != 200 {
		t.Fatalf("healthz (liveness) with the store down: %+v", h)
	}
	if n := up.total.Load(); n != 1 {
		t.Fatalf("upstream ran %d times; only the request before the outage may have run", n)
	}
	if err := px.Up(); err != nil {
		t.Fatal(err)
	}
	// go-redis re-dials a pool that saw dial errors in the background, once
	// a second: retry as a client would, after Retry-After.
	a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "down-0")
	for i := 0; a.status == 503 && i < 10; i++ {
		waitRetryAfter(a)
		a = send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "down-0")
	}
	if a.status != 201 || up.total.Load() != 2 {
		t.Fatalf("after the store came back: %+v, upstream ran %d", a, up.total.Load())
	}
}

func TestMetricsAndHealth(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:", "-admin", "127.0.0.1:0")
	// Every outcome is exported from the start, at zero.
	if m := send("GET", "http://"+gw.admin+"/metrics", ""); !strings.Contains(m.body, `idem_outcomes_total{operation="gateway",outcome="acquired"} 0`) {
		t.Errorf("before any request, metrics lack the outcomes at zero:\n%s", m.body)
	}
	send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "m")
	send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "m")
	send("POST", gw.url("/orders"), `{"x":1}`, "Idempotency-Key", "m")
	m := send("GET", "http://"+gw.admin+"/metrics", "")
	for _, want := range []string{
		`idem_outcomes_total{operation="gateway",outcome="acquired"} 1`,
		`idem_outcomes_total{operation="gateway",outcome="cache_hit"} 1`, // the replay, from the local cache
		`idem_outcomes_total{operation="gateway",outcome="mismatch"} 1`,
		`idem_outcomes_total{operation="gateway",outcome="uncertain"} 0`,
		`idem_store_call_duration_seconds_count{op="claim",result="ok"} 1`,
		`idem_store_call_duration_seconds_count{op="complete",result="ok"} 1`,
		`idem_gateway_in_flight_requests 0`,
		`idem_gateway_responses_total{code="201",replayed="true"} 1`,
		`idem_gateway_responses_total{code="422",replayed="false"} 1`,
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if h := send("GET", "http://"+gw.admin+"/healthz", ""); h.status != 200 || h.body != "ok\n" {
		t.Fatalf("healthz: %+v", h)
	}
	if h := send("GET", "http://"+gw.admin+"/readyz", ""); h.status != 200 || h.body != "ready\n" {
		t.Fatalf("readyz: %+v", h)
	}
}

func TestSIGTERMFinishesInFlightRequests(t *testing.T) {
	up := newUpstream(t)
	db := t.TempDir() + "/gw.db"
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+db, "-grace", "30s")
	release := up.holdAll()
	defer release()
	inflight := make(chan answer, 1)
	go func() { inflight <- send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", "term") }()
	<-up.arrived
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// New connections are refused once shutdown began; the held request
	// still completes.
	waitRefused(t, gw.addr)
	release()
	if a := <-inflight; a.status != 201 {
		t.Fatalf("in-flight request: %+v", a)
	}
	if err := gw.wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, gw.logs)
	}
	// The store was closed cleanly and kept the outcome.
	gw2 := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+db)
	if a := send("POST", gw2.url("/orders"), `{}`, "Idempotency-Key", "term"); !a.replayed() || up.count("term") != 1 {
		t.Fatalf("after restart: %+v", a)
	}
}

// waitRefused returns once addr refuses connections.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		c.Close()
		runtime.Gosched()
	}
	t.Fatalf("%s still accepts connections after SIGTERM", addr)
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
