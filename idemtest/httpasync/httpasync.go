// Package httpasync is the suite of idemhttp's asynchronous mode — 202
// Accepted, a status resource, and a worker that settles the key later from
// another engine — run over a store: the in-memory store in idemhttp's own
// tests, a real server in the tests of a store that talks to one (the
// fenced Extend that hands a claim off, its reference, and writes through a
// token from another engine are the store's to get right). Test-only.
package httpasync

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
)

// T0 is the suite's clock's start. It lies in the future, so that a store
// with a native expiry (Redis's PEXPIREAT) keeps what the suite writes.
var T0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// StatusPath is the suite's Config.StatusPath.
const StatusPath = "/idempotency/status/"

// expected is the suite's Config.ExpectedCompletion.
const expected = 10 * time.Minute

// env is one subtest's world: a store, a manual clock, the engine and
// middleware of the server that accepts work, and those of a worker in
// another engine on the same store.
type env struct {
	clock  *clocktest.Clock
	store  *faultstore.Store
	eng    *idem.Engine
	mw     *idemhttp.Middleware
	srv    *httptest.Server
	worker *idemhttp.Middleware // another engine on the same store, no StatusPath

	runs   atomic.Int64
	tokens chan string   // every token a handler accepted work with
	held   chan struct{} // receives when /block is entered
	free   chan struct{} // closed to let /block answer
}

func setup(t *testing.T, newStore func(t *testing.T) store.Store) *env {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	en := &env{clock: clocktest.New(T0), store: faultstore.New(newStore(t)),
		tokens: make(chan string, 8), held: make(chan struct{}, 8), free: make(chan struct{})}
	engine := func() *idem.Engine {
		e, err := idem.New(en.store, &idem.Config{Clock: en.clock, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	principal := func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
	en.eng = engine()
	var err error
	en.mw, err = idemhttp.New(en.eng, &idemhttp.Config{Principal: principal, StatusPath: StatusPath, ExpectedCompletion: expected, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if en.worker, err = idemhttp.New(engine(), &idemhttp.Config{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	en.srv = httptest.NewUnstartedServer(en.mw.Handler(http.HandlerFunc(en.handle)))
	en.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic case's
	en.srv.Start()
	t.Cleanup(func() {
		select {
		case <-en.free:
		default:
			close(en.free)
		}
		en.srv.Close()
	})
	return en
}

// handle is the service: /accept hands the work off and answers 202,
// /panic hands it off and panics, /unqueued hands it off and answers 503
// (its queue is down), /block answers 201 once let go.
func (en *env) handle(w http.ResponseWriter, r *http.Request) {
	en.runs.Add(1)
	switch r.URL.Path {
	case "/accept", "/panic", "/unqueued":
		tok, err := idemhttp.Accept(w, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/unqueued" {
			http.Error(w, "the queue is down", http.StatusServiceUnavailable)
			return
		}
		en.tokens <- tok.String()
		if r.URL.Path == "/panic" {
			panic("the handler fails after handing its work off")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"accepted":true}`)
	case "/block":
		en.held <- struct{}{}
		<-en.free
		w.WriteHeader(http.StatusCreated)
	default:
		http.NotFound(w, r)
	}
}

type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

// do sends a request as principal who ("" for none); key "" sends none.
// It may run outside the test's goroutine.
func (en *env) do(method, path, who, key string) reply {
	req, err := http.NewRequest(method, en.srv.URL+path, strings.NewReader(`{"amount":10}`))
	if err != nil {
		return reply{err: err}
	}
	// A fresh connection each time: net/http's Transport resends a request
	// carrying an Idempotency-Key when a kept-alive connection dies under
	// it (as the panic case's does), which would hide the failure.
	req.Close = true
	if who != "" {
		req.Header.Set("Authorization", who)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderName, key)
	}
	resp, err := en.srv.Client().Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// token returns the token of the work the last /accept handed off.
func (en *env) token(t *testing.T) string {
	t.Helper()
	select {
	case s := <-en.tokens:
		return s
	default:
		t.Fatal("no work was handed off")
		return ""
	}
}

// accept sends a new request to /accept and checks the 202.
func (en *env) accept(t *testing.T, who, key string) (location, token string) {
	t.Helper()
	a := en.do("POST", "/accept", who, key)
	loc := a.header.Get("Location")
	if a.err != nil || a.status != http.StatusAccepted || a.body != `{"accepted":true}` || !strings.HasPrefix(loc, StatusPath) ||
		len(strings.TrimPrefix(loc, StatusPath)) != 64 || a.header.Get("Retry-After") != strconv.Itoa(int(expected/time.Second)) {
		t.Fatalf("accepting: %+v", a)
	}
	return loc, en.token(t)
}

// status decodes a status resource (or the body of a 202 that answers a
// duplicate) after checking its status code and Content-Type.
func status(t *testing.T, r reply, code int) idemhttp.StatusResource {
	t.Helper()
	if r.err != nil || r.status != code || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status resource: %+v, want %d application/json", r, code)
	}
	var s idemhttp.StatusResource
	if err := json.Unmarshal([]byte(r.body), &s); err != nil {
		t.Fatalf("status resource %s: %v", r.body, err)
	}
	return s
}

// problem checks a problem+json answer's status and type.
func problem(t *testing.T, r reply, code int, typ string) idemhttp.Problem {
	t.Helper()
	var p idemhttp.Problem
	if r.err != nil || r.status != code || r.header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal([]byte(r.body), &p) != nil || p.Type != typ || p.Status != code {
		t.Fatalf("answer %+v, want a %d problem of type %s", r, code, typ)
	}
	return p
}

// Run runs the suite over the stores newStore returns, a fresh one (or a
// fresh key space) for each case.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("AcceptAnswers202AndDuplicatesGetTheStatus", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, _ := en.accept(t, "alice", "k1")
		want := idemhttp.StatusResource{Status: "IN_PROGRESS", Execution: loc, Created: T0}
		check := func(s idemhttp.StatusResource) {
			t.Helper()
			if s.Status != want.Status || s.Execution != want.Execution || !s.Created.Equal(T0) ||
				s.ExpectedCompletion == nil || !s.ExpectedCompletion.Equal(T0.Add(expected)) ||
				s.CompletedAt != nil || s.Result != nil || s.Problem != nil {
				t.Fatalf("status %+v, want IN_PROGRESS since T0, expected at T0+%v, execution %s", s, expected, loc)
			}
		}
		en.clock.Advance(time.Minute)
		dup := en.do("POST", "/accept", "alice", "k1")
		check(status(t, dup, http.StatusAccepted))
		if dup.header.Get("Location") != loc || dup.header.Get("Retry-After") != "540" {
			t.Fatalf("duplicate during the work: %+v, want Location %s and Retry-After 540", dup, loc)
		}
		get := en.do("GET", loc, "alice", "")
		check(status(t, get, http.StatusOK))
		if head := en.do("HEAD", loc, "alice", ""); head.status != http.StatusOK || head.body != "" {
			t.Fatalf("HEAD of the status: %+v", head)
		}
		if n := en.runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times", n)
		}
		if n := en.store.Calls("complete") + en.store.Calls("fail") + en.store.Calls("release"); n != 0 {
			t.Fatalf("%d outcome writes for handed-off work", n)
		}
	})

	t.Run("StatusIsScopedByPrincipal", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, _ := en.accept(t, "alice", "k1")
		problem(t, en.do("GET", loc, "bob", ""), http.StatusNotFound, idemhttp.ProblemTypeBase+idemhttp.ProblemStatusNotFound)
		problem(t, en.do("GET", loc, "", ""), http.StatusNotFound, idemhttp.ProblemTypeBase+idemhttp.ProblemStatusNotFound)
		// Bob's request with the same key is his own: the same status id
		// (the key's digest) names his record when he asks.
		en.clock.Advance(time.Minute)
		if bob, _ := en.accept(t, "bob", "k1"); bob != loc {
			t.Fatalf("status id %s for the same key and route, want %s", bob, loc)
		}
		for who, created := range map[string]time.Time{"alice": T0, "bob": T0.Add(time.Minute)} {
			if s := status(t, en.do("GET", loc, who, ""), http.StatusOK); !s.Created.Equal(created) {
				t.Fatalf("%s reads a record created at %v, want %v", who, s.Created, created)
			}
		}
		for _, bad := range []string{StatusPath + strings.ToUpper(strings.TrimPrefix(loc, StatusPath)), loc[:len(loc)-1], loc + "0", loc + "/x", StatusPath} {
			problem(t, en.do("GET", bad, "alice", ""), http.StatusNotFound, idemhttp.ProblemTypeBase+idemhttp.ProblemStatusNotFound)
		}
		p := en.do("POST", loc, "alice", "k2")
		problem(t, p, http.StatusMethodNotAllowed, idemhttp.ProblemTypeBase+idemhttp.ProblemMethodNotAllowed)
		if p.header.Get("Allow") != "GET, HEAD" {
			t.Fatalf("405 without Allow: %+v", p)
		}
	})

	t.Run("WorkerInAnotherEngineCompletes", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, tok := en.accept(t, "alice", "k1")
		en.clock.Advance(time.Minute)
		err := en.worker.Complete(context.Background(), tok, idemhttp.Response{Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}, "X-Charge-Id": {"ch_1"}, "Set-Cookie": {"s=secret"}},
			Body:   []byte(`{"order":"ord_1"}`)})
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		again := en.do("POST", "/accept", "alice", "k1")
		if again.status != http.StatusCreated || again.body != `{"order":"ord_1"}` || again.header.Get(idemhttp.ReplayedHeader) != "true" ||
			again.header.Get("X-Charge-Id") != "ch_1" || again.header.Get("Set-Cookie") != "" {
			t.Fatalf("duplicate after the work: %+v", again)
		}
		s := status(t, en.do("GET", loc, "alice", ""), http.StatusOK)
		if s.Status != "COMPLETED" || s.CompletedAt == nil || !s.CompletedAt.Equal(T0.Add(time.Minute)) || s.Result == nil ||
			s.Result.Status != http.StatusCreated || string(s.Result.Body) != `{"order":"ord_1"}` || s.Result.BodyBase64 != nil ||
			s.Result.Headers.Get("X-Charge-Id") != "ch_1" || s.Result.Headers.Get("Set-Cookie") != "" || s.Problem != nil {
			t.Fatalf("status after the work: %+v %+v", s, s.Result)
		}
		if n := en.runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times", n)
		}
		// Settled: the token is spent.
		if err := en.worker.Release(context.Background(), tok); !errors.Is(err, idem.ErrStaleToken) {
			t.Fatalf("Release after Complete: %v, want ErrStaleToken", err)
		}
	})

	t.Run("BodyThatIsNotJSONIsShownInBase64", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, tok := en.accept(t, "alice", "k1")
		body := []byte{0xff, 0x00, 'x'}
		if err := en.worker.Complete(context.Background(), tok, idemhttp.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body}); err != nil {
			t.Fatal(err)
		}
		s := status(t, en.do("GET", loc, "alice", ""), http.StatusOK)
		if s.Result == nil || s.Result.Body != nil || string(s.Result.BodyBase64) != string(body) {
			t.Fatalf("result %+v", s.Result)
		}
	})

	t.Run("FailureIsReplayedAsItsProblem", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, tok := en.accept(t, "alice", "k1")
		declined := idemhttp.Problem{Type: "urn:example:declined", Title: "Card declined", Status: http.StatusPaymentRequired, Detail: "insufficient funds"}
		if err := en.worker.Fail(context.Background(), tok, declined); err != nil {
			t.Fatalf("Fail: %v", err)
		}
		again := en.do("POST", "/accept", "alice", "k1")
		p := problem(t, again, http.StatusPaymentRequired, "urn:example:declined")
		if p.Title != declined.Title || p.Detail != declined.Detail || again.header.Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("replayed failure: %+v %+v", again, p)
		}
		s := status(t, en.do("GET", loc, "alice", ""), http.StatusOK)
		if s.Status != "FAILED" || s.Problem == nil || s.Problem.Type != declined.Type || s.Problem.Status != 402 || s.Result != nil || s.CompletedAt == nil {
			t.Fatalf("status after the failure: %+v", s)
		}
		if n := en.runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times", n)
		}
	})

	t.Run("StaleTokenAfterTakeoverIsRefused", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, old := en.accept(t, "alice", "k1")
		en.clock.Advance(expected + time.Second) // the worker never settled
		loc2, fresh := en.accept(t, "alice", "k1")
		if loc2 != loc || fresh == old || en.runs.Load() != 2 {
			t.Fatalf("takeover: location %s (was %s), runs %d", loc2, loc, en.runs.Load())
		}
		err := en.worker.Complete(context.Background(), old, idemhttp.Response{Status: 200, Body: []byte("late")})
		var stale *idem.StaleTokenError
		if !errors.As(err, &stale) || stale.Status != idem.StatusInProgress {
			t.Fatalf("Complete through the stale token: %v, want a *StaleTokenError naming the new claim", err)
		}
		for name, err := range map[string]error{
			"Fail":    en.worker.Fail(context.Background(), old, idemhttp.Problem{Status: 500}),
			"Extend":  en.worker.Extend(context.Background(), old, time.Hour),
			"Attach":  en.worker.Attach(context.Background(), old, "job-1"),
			"Release": en.worker.Release(context.Background(), old),
		} {
			if !errors.Is(err, idem.ErrStaleToken) {
				t.Errorf("%s through the stale token: %v", name, err)
			}
		}
		s := status(t, en.do("GET", loc, "alice", ""), http.StatusOK)
		if s.Status != "IN_PROGRESS" || !s.Created.Equal(T0.Add(expected+time.Second)) {
			t.Fatalf("the new claim changed: %+v", s)
		}
		if err := en.worker.Complete(context.Background(), fresh, idemhttp.Response{Status: 200, Body: []byte("done")}); err != nil {
			t.Fatalf("Complete through the new token: %v", err)
		}
	})

	t.Run("TokenOfAnotherOperationIsRefusedBeforeAnyWrite", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, tok := en.accept(t, "alice", "k1")
		eng, err := idem.New(en.store, &idem.Config{Clock: en.clock, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		other, err := idemhttp.New(eng, &idemhttp.Config{Operation: "refunds"})
		if err != nil {
			t.Fatal(err)
		}
		before := en.store.Total()
		for name, err := range map[string]error{
			"Complete": other.Complete(context.Background(), tok, idemhttp.Response{Status: 200}),
			"Fail":     other.Fail(context.Background(), tok, idemhttp.Problem{Status: 500}),
			"Release":  other.Release(context.Background(), tok),
			"Extend":   other.Extend(context.Background(), tok, time.Hour),
			"Attach":   other.Attach(context.Background(), tok, "job-1"),
			"garbage":  en.worker.Complete(context.Background(), "not-a-token", idemhttp.Response{Status: 200}),
		} {
			if !errors.Is(err, idem.ErrInvalidToken) {
				t.Errorf("%s: %v, want ErrInvalidToken", name, err)
			}
		}
		if n := en.store.Total() - before; n != 0 {
			t.Fatalf("%d store calls for refused tokens", n)
		}
		if s := status(t, en.do("GET", loc, "alice", ""), http.StatusOK); s.Status != "IN_PROGRESS" {
			t.Fatalf("status %+v", s)
		}
	})

	t.Run("InvalidOutcomeIsRefusedBeforeAnyWrite", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		_, tok := en.accept(t, "alice", "k1")
		before := en.store.Total()
		for name, err := range map[string]error{
			"status 0":       en.worker.Complete(context.Background(), tok, idemhttp.Response{}),
			"status 102":     en.worker.Complete(context.Background(), tok, idemhttp.Response{Status: 102}),
			"body too large": en.worker.Complete(context.Background(), tok, idemhttp.Response{Status: 200, Body: make([]byte, 1<<20+1)}),
			"problem 200":    en.worker.Fail(context.Background(), tok, idemhttp.Problem{Status: 200}),
		} {
			var oe *idemhttp.OutcomeError
			if !errors.As(err, &oe) || !errors.Is(err, idemhttp.ErrInvalidOutcome) {
				t.Errorf("%s: %v, want an *OutcomeError", name, err)
			}
		}
		if n := en.store.Total() - before; n != 0 {
			t.Fatalf("%d store calls for refused outcomes", n)
		}
	})

	t.Run("WorkerExtendsAndAttaches", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		loc, tok := en.accept(t, "alice", "k1")
		en.clock.Advance(expected - time.Minute)
		ctx := context.Background()
		if err := en.worker.Extend(ctx, tok, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := en.worker.Attach(ctx, tok, "arn:aws:states:eu-west-1:1:execution:orders:k1"); err != nil {
			t.Fatal(err)
		}
		en.clock.Advance(2 * time.Minute) // past the first expected completion: no takeover
		dup := en.do("POST", "/accept", "alice", "k1")
		s := status(t, dup, http.StatusAccepted)
		if dup.header.Get("Location") != loc || s.Execution != "arn:aws:states:eu-west-1:1:execution:orders:k1" ||
			!s.ExpectedCompletion.Equal(T0.Add(expected-time.Minute+time.Hour)) || en.runs.Load() != 1 {
			t.Fatalf("duplicate after Extend and Attach: %+v %+v, runs %d", dup, s, en.runs.Load())
		}
		if err := en.worker.Release(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if _, tok2 := en.accept(t, "alice", "k1"); tok2 == tok || en.runs.Load() != 2 {
			t.Fatalf("after Release the handler ran %d times", en.runs.Load())
		}
	})

	t.Run("PanicAfterAcceptKeepsTheClaim", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		if a := en.do("POST", "/panic", "alice", "k1"); a.err == nil {
			t.Fatalf("a panicking handler answered: %+v", a)
		}
		tok := en.token(t)
		dup := en.do("POST", "/panic", "alice", "k1")
		if s := status(t, dup, http.StatusAccepted); s.Status != "IN_PROGRESS" || en.runs.Load() != 1 {
			t.Fatalf("duplicate after the panic: %+v, runs %d", dup, en.runs.Load())
		}
		if n := en.store.Calls("release"); n != 0 {
			t.Fatalf("the claim was released %d times", n)
		}
		if err := en.worker.Complete(context.Background(), tok, idemhttp.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}
		if again := en.do("POST", "/panic", "alice", "k1"); again.status != 201 || again.header.Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("after Complete: %+v", again)
		}
	})

	t.Run("ErrorAfterAcceptReleasesTheClaim", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		if a := en.do("POST", "/unqueued", "alice", "k1"); a.status != http.StatusServiceUnavailable {
			t.Fatalf("accepted, then 503: %+v", a)
		}
		if n := en.store.Calls("release"); n != 1 {
			t.Fatalf("the handed-off claim was released %d times, want 1", n)
		}
		if again := en.do("POST", "/unqueued", "alice", "k1"); again.status != http.StatusServiceUnavailable || en.runs.Load() != 2 {
			t.Fatalf("a retry after the 503 did not run the handler again: %+v, runs %d", again, en.runs.Load())
		}
	})

	t.Run("SynchronousRequestInFlightIsStill409", func(t *testing.T) {
		t.Parallel()
		en := setup(t, newStore)
		first := make(chan reply, 1)
		go func() { first <- en.do("POST", "/block", "alice", "k1") }()
		<-en.held
		problem(t, en.do("POST", "/block", "alice", "k1"), http.StatusConflict, idemhttp.ProblemTypeBase+idemhttp.ProblemInProgress)
		close(en.free)
		if a := <-first; a.status != http.StatusCreated {
			t.Fatalf("first: %+v", a)
		}
		if again := en.do("POST", "/block", "alice", "k1"); again.status != 201 || again.header.Get(idemhttp.ReplayedHeader) != "true" {
			t.Fatalf("replay: %+v", again)
		}
	})
}
