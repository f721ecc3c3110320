package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

const statusPath = "/idempotency/status/"

// asyncUpstream accepts work: /transfers answers 202 and queues the
// request's Idem-Token for a worker (the test); /fast settles the key
// through settleVia before it answers 202, as a quick worker may; /sync
// answers 201 at once. It keeps the Idem-Token every request came with.
type asyncUpstream struct {
	srv       *httptest.Server
	jobs      chan string
	settleVia func(token string) // set before /fast is used
	mu        sync.Mutex
	seen      map[string][]string // request path -> the Idem-Token of each request
}

func newAsyncUpstream(t *testing.T) *asyncUpstream {
	u := &asyncUpstream{jobs: make(chan string, 16), seen: map[string][]string{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		tok := r.Header.Get("Idem-Token")
		u.mu.Lock()
		u.seen[r.URL.Path] = append(u.seen[r.URL.Path], tok)
		u.mu.Unlock()
		switch r.URL.Path {
		case "/transfers", "/fast":
			if r.URL.Path == "/fast" {
				u.settleVia(tok)
			} else {
				u.jobs <- tok
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/jobs/1") // replaced by the gateway's status resource
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"queued":true}`)
		case "/sync":
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// tokens returns the Idem-Token of every request to path.
func (u *asyncUpstream) tokens(path string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen[path]...)
}

// job returns the token of the last accepted /transfers request.
func (u *asyncUpstream) job(t *testing.T) string {
	t.Helper()
	select {
	case tok := <-u.jobs:
		if tok == "" {
			t.Fatal("the upstream got no Idem-Token")
		}
		return tok
	default:
		t.Fatal("no work was accepted")
		return ""
	}
}

// settle posts one token action to a gateway's admin listener.
func settle(admin, tok, action, contentType, body string) answer {
	return send("POST", "http://"+admin+"/idem/v1/tokens/"+tok+"/"+action, body, "Content-Type", contentType)
}

func statusOf(t *testing.T, a answer, code int) idemhttp.StatusResource {
	t.Helper()
	var s idemhttp.StatusResource
	if a.err != nil || a.status != code || a.header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(a.body), &s) != nil {
		t.Fatalf("status resource: %+v, want %d application/json", a, code)
	}
	return s
}

// A covered request whose upstream answers 202 is handed off: the client
// gets 202 and the gateway's status resource, retries get 202 and the
// status until the worker settles the key through the admin listener, then
// the worker's answer, replayed. All of it once more with signed tokens
// (-token-key-file): the workers settle as before.
func TestAsyncHandOffThroughTheAdminListener(t *testing.T) {
	t.Run("unsigned", func(t *testing.T) { asyncHandOff(t) })
	t.Run("signed", func(t *testing.T) {
		keyFile := filepath.Join(t.TempDir(), "token.key")
		if err := os.WriteFile(keyFile, []byte("a-secret-of-more-than-16-bytes\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		asyncHandOff(t, "-token-key-file", keyFile)
	})
}

func asyncHandOff(t *testing.T, extra ...string) {
	up := newAsyncUpstream(t)
	gw := startGateway(t, append([]string{"-upstream", up.srv.URL, "-store", "bolt://" + t.TempDir() + "/gw.db", "-admin", "127.0.0.1:0",
		"-status-path", statusPath, "-expected-completion", "5m"}, extra...)...)
	up.settleVia = func(tok string) {
		if a := settle(gw.admin, tok, "complete?status=201", "application/json", `{"fast":true}`); a.status != http.StatusNoContent {
			t.Errorf("complete from inside the upstream: %+v", a)
		}
	}
	post := func(path, key string, header ...string) answer {
		return send("POST", gw.url(path), `{"amount":10}`, append([]string{"Idempotency-Key", key}, header...)...)
	}

	t.Run("complete", func(t *testing.T) {
		first := post("/transfers", "t1", "Idem-Token", "forged-by-the-client")
		loc := first.header.Get("Location")
		if first.status != http.StatusAccepted || first.body != `{"queued":true}` || !strings.HasPrefix(loc, statusPath) ||
			first.header.Get("Retry-After") != "300" {
			t.Fatalf("first: %+v", first)
		}
		tok := up.job(t)
		if tok == "forged-by-the-client" {
			t.Fatal("the client's Idem-Token reached the upstream")
		}
		dup := post("/transfers", "t1")
		if s := statusOf(t, dup, http.StatusAccepted); s.Status != "IN_PROGRESS" || s.Execution != loc || dup.header.Get("Location") != loc {
			t.Fatalf("duplicate during the work: %+v", dup)
		}
		if n := len(up.tokens("/transfers")); n != 1 {
			t.Fatalf("the upstream got %d requests", n)
		}
		if s := statusOf(t, send("GET", gw.url(loc), ""), http.StatusOK); s.Status != "IN_PROGRESS" {
			t.Fatalf("status: %+v", s)
		}

		// The public listener has no token endpoints: it proxies the
		// request like any other, and nothing is settled.
		if a := send("POST", gw.url("/idem/v1/tokens/"+tok+"/complete"), "x"); a.status != http.StatusNotFound {
			t.Fatalf("token endpoint on the public listener: %+v", a)
		}
		for _, c := range []struct {
			tok, action string
			status      int
			problem     string
		}{
			{"garbage", "complete", 400, "invalid-token"},
			{tok, "extend?for=soon", 400, "invalid-request"},
			{tok, "extend?for=-1m", 400, "invalid-request"},
			{tok, "attach?ref=", 400, "invalid-request"},
			{tok, "complete?status=abc", 400, "invalid-request"},
			{tok, "complete?status=100", 400, "invalid-outcome"},
			{tok, "fail", 400, "invalid-request"}, // no problem in the body
		} {
			if a := settle(gw.admin, c.tok, c.action, "text/plain", ""); a.status != c.status || a.problemType() != c.problem {
				t.Errorf("%s: %+v, want %d %s", c.action, a, c.status, c.problem)
			}
		}
		if a := settle(gw.admin, tok, "nonsense", "", ""); a.status != http.StatusNotFound {
			t.Errorf("unknown action: %+v", a)
		}
		for _, action := range []string{"extend?for=10m", "attach?ref=" + url.QueryEscape("queue://transfers/17")} {
			if a := settle(gw.admin, tok, action, "", ""); a.status != http.StatusNoContent {
				t.Fatalf("%s: %+v", action, a)
			}
		}
		if s := statusOf(t, send("GET", gw.url(loc), ""), http.StatusOK); s.Execution != "queue://transfers/17" {
			t.Fatalf("status after attach: %+v", s)
		}
		if a := settle(gw.admin, tok, "complete?status=201", "application/json", `{"transfer":"tr_1"}`); a.status != http.StatusNoContent {
			t.Fatalf("complete: %+v", a)
		}
		again := post("/transfers", "t1")
		if again.status != http.StatusCreated || !again.replayed() || again.body != `{"transfer":"tr_1"}` || again.header.Get("Content-Type") != "application/json" {
			t.Fatalf("after the work: %+v", again)
		}
		s := statusOf(t, send("GET", gw.url(loc), ""), http.StatusOK)
		if s.Status != "COMPLETED" || s.Result == nil || s.Result.Status != 201 || string(s.Result.Body) != `{"transfer":"tr_1"}` {
			t.Fatalf("status after the work: %+v", s)
		}
		// A worker's retry of its Complete is answered as the first was
		// (its write is recognised as landed) and changes nothing; any
		// other write through the spent token — another response too — is
		// refused.
		if a := settle(gw.admin, tok, "complete?status=201", "application/json", `{"transfer":"tr_1"}`); a.status != http.StatusNoContent {
			t.Fatalf("Complete again: %+v", a)
		}
		if a := settle(gw.admin, tok, "complete", "text/plain", "another"); a.status != http.StatusConflict || a.problemType() != "stale-token" {
			t.Fatalf("Complete with another response through a spent token: %+v", a)
		}
		if a := post("/transfers", "t1"); a.body != `{"transfer":"tr_1"}` {
			t.Fatalf("the second Complete changed the response: %+v", a)
		}
		if a := settle(gw.admin, tok, "release", "", ""); a.status != http.StatusConflict || a.problemType() != "stale-token" {
			t.Fatalf("a spent token: %+v", a)
		}
		if n := len(up.tokens("/transfers")); n != 1 {
			t.Fatalf("the upstream got %d requests", n)
		}
	})

	t.Run("fail", func(t *testing.T) {
		post("/transfers", "t2")
		tok := up.job(t)
		if a := settle(gw.admin, tok, "fail", "application/problem+json", `{"type":"urn:example:declined","title":"Declined","status":402}`); a.status != http.StatusNoContent {
			t.Fatalf("fail: %+v", a)
		}
		again := post("/transfers", "t2")
		if again.status != http.StatusPaymentRequired || again.problemType() != "urn:example:declined" || !again.replayed() {
			t.Fatalf("after the failure: %+v", again)
		}
	})

	t.Run("release", func(t *testing.T) {
		post("/transfers", "t3")
		tok := up.job(t)
		if a := settle(gw.admin, tok, "release", "", ""); a.status != http.StatusNoContent {
			t.Fatalf("release: %+v", a)
		}
		if again := post("/transfers", "t3"); again.status != http.StatusAccepted || again.replayed() {
			t.Fatalf("after the release: %+v", again)
		}
		if tok2 := up.job(t); tok2 == tok {
			t.Fatal("the second run got the released token")
		}
	})

	t.Run("synchronous answers are stored as always", func(t *testing.T) {
		first := post("/sync", "s1")
		again := post("/sync", "s1")
		if first.status != 201 || again.status != 201 || !again.replayed() || len(up.tokens("/sync")) != 1 || up.tokens("/sync")[0] == "" {
			t.Fatalf("first %+v, again %+v, tokens %q", first, again, up.tokens("/sync"))
		}
		// An uncovered request carries no token, not even the client's.
		send("GET", gw.url("/sync"), "", "Idem-Token", "forged")
		if toks := up.tokens("/sync"); len(toks) != 2 || toks[1] != "" {
			t.Fatalf("tokens %q", toks)
		}
	})

	t.Run("worker settles before the 202 arrives", func(t *testing.T) {
		first := post("/fast", "f1")
		loc := first.header.Get("Location")
		if first.status != http.StatusAccepted || !strings.HasPrefix(loc, statusPath) {
			t.Fatalf("first: %+v", first)
		}
		again := post("/fast", "f1")
		if again.status != http.StatusCreated || !again.replayed() || again.body != `{"fast":true}` {
			t.Fatalf("after the quick worker: %+v", again)
		}
		if s := statusOf(t, send("GET", gw.url(loc), ""), http.StatusOK); s.Status != "COMPLETED" {
			t.Fatalf("status: %+v", s)
		}
	})
}

// Two gateways on one Redis: the client's gateway hands the work off, the
// worker settles it through the other's admin listener, and the status is
// the caller's alone.
func TestAsyncAcrossGatewaysOnOneStore(t *testing.T) {
	addr, via := sharedStore(t, "redis")
	up := newAsyncUpstream(t)
	args := []string{"-upstream", up.srv.URL, "-store", via(addr), "-admin", "127.0.0.1:0", "-status-path", statusPath, "-principal-header", "Authorization"}
	front, back := startGateway(t, args...), startGateway(t, args...)
	first := send("POST", front.url("/transfers"), `{}`, "Idempotency-Key", "x1", "Authorization", "alice")
	loc := first.header.Get("Location")
	if first.status != http.StatusAccepted || loc == "" {
		t.Fatalf("first: %+v", first)
	}
	tok := up.job(t)
	if a := send("GET", back.url(loc), "", "Authorization", "bob"); a.status != http.StatusNotFound || a.problemType() != "status-not-found" {
		t.Fatalf("another principal's status: %+v", a)
	}
	if s := statusOf(t, send("GET", back.url(loc), "", "Authorization", "alice"), http.StatusOK); s.Status != "IN_PROGRESS" {
		t.Fatalf("status on the other gateway: %+v", s)
	}
	if a := settle(back.admin, tok, "complete?status=201", "text/plain", "moved"); a.status != http.StatusNoContent {
		t.Fatalf("complete through the other gateway: %+v", a)
	}
	again := send("POST", front.url("/transfers"), `{}`, "Idempotency-Key", "x1", "Authorization", "alice")
	if again.status != http.StatusCreated || again.body != "moved" || !again.replayed() {
		t.Fatalf("after the work: %+v", again)
	}
}

// With -token-key-file, the tokens the upstream gets are signed: a worker
// extends and settles the key with one, and a token altered on the way
// (another owner) or stripped of its signature is refused as invalid by
// every token endpoint before any store call, the key left as it was. A
// key too short keeps the gateway from starting.
func TestSignedTokensThroughTheGateway(t *testing.T) {
	up := newAsyncUpstream(t)
	keyFile := filepath.Join(t.TempDir(), "token.key")
	if err := os.WriteFile(keyFile, []byte("a-secret-of-more-than-16-bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+t.TempDir()+"/gw.db", "-admin", "127.0.0.1:0",
		"-status-path", statusPath, "-token-key-file", keyFile)
	if a := send("POST", gw.url("/transfers"), `{"amount":10}`, "Idempotency-Key", "signed-1"); a.status != http.StatusAccepted {
		t.Fatalf("first: %+v", a)
	}
	tok := up.job(t)
	parsed, err := idem.ParseToken(tok, "")
	if err != nil {
		t.Fatal(err)
	}
	altered := parsed
	altered.Owner = "someone/else"
	unsigned := idem.Token{Key: parsed.Key, Fence: parsed.Fence, Owner: parsed.Owner, Status: parsed.Status}
	// Every token endpoint refuses an altered or an unsigned token before
	// any store call (the store-call histogram does not move).
	calls := storeCalls(t, gw.admin)
	if calls == 0 {
		t.Fatal("the first request's store calls are not counted: is the histogram still idem_store_call_duration_seconds?")
	}
	for _, bad := range []struct{ name, tok string }{{"altered", altered.String()}, {"unsigned", unsigned.String()}} {
		for _, action := range []struct{ path, ct, body string }{
			{"complete?status=201", "text/plain", "forged"},
			{"fail", "application/problem+json", `{"status":409,"title":"forged"}`},
			{"release", "", ""},
			{"extend?for=10m", "", ""},
			{"attach?ref=arn:forged", "", ""},
		} {
			if a := settle(gw.admin, bad.tok, action.path, action.ct, action.body); a.status != http.StatusBadRequest || a.problemType() != "invalid-token" {
				t.Fatalf("%s with an %s token: %+v, want 400 invalid-token", action.path, bad.name, a)
			}
		}
	}
	if now := storeCalls(t, gw.admin); now != calls {
		t.Fatalf("refused tokens made %d store calls, want none", now-calls)
	}
	if a := settle(gw.admin, tok, "extend?for=10m", "", ""); a.status != http.StatusNoContent {
		t.Fatalf("extend with the signed token: %+v", a)
	}
	if a := settle(gw.admin, tok, "complete?status=201", "text/plain", "done"); a.status != http.StatusNoContent {
		t.Fatalf("the signed token: %+v", a)
	}
	if a := send("POST", gw.url("/transfers"), `{"amount":10}`, "Idempotency-Key", "signed-1"); a.status != http.StatusCreated || a.body != "done" {
		t.Fatalf("replay after the signed completion: %+v", a)
	}

	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "-upstream", up.srv.URL, "-store", "memory:", "-token-key-file", short).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "16") {
		t.Fatalf("a 5-byte token key: %v %s", err, out)
	}
}

// storeCalls is the number of store calls the gateway at admin has made:
// the count of its idem_store_call_duration_seconds histogram.
func storeCalls(t *testing.T, admin string) int {
	t.Helper()
	a := send("GET", "http://"+admin+"/metrics", "")
	if a.status != http.StatusOK {
		t.Fatalf("metrics: %+v", a)
	}
	n := 0
	for _, line := range strings.Split(a.body, "\n") {
		if !strings.HasPrefix(line, "idem_store_call_duration_seconds_count") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += int(v)
	}
	return n
}
