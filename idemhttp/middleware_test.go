package idemhttp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type env struct {
	clock *clocktest.Clock
	store *faultstore.Store
	eng   *idem.Engine
	srv   *httptest.Server
	runs  atomic.Int64
}

// setup serves handler behind the middleware on a loopback server, with an
// engine over a memstore and a manual clock.
func setup(t *testing.T, ecfg idem.Config, mcfg *idemhttp.Config, handler http.HandlerFunc) *env {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	en := &env{clock: clocktest.New(t0), store: faultstore.New(mem)}
	ecfg.Clock = en.clock
	ecfg.Logger = slog.New(slog.DiscardHandler)
	if ecfg.RenewInterval == 0 {
		ecfg.RenewInterval = -1
	}
	var err error
	if en.eng, err = idem.New(en.store, &ecfg); err != nil {
		t.Fatal(err)
	}
	if mcfg == nil {
		mcfg = &idemhttp.Config{}
	}
	mcfg.Logger = slog.New(slog.DiscardHandler)
	mw, err := idemhttp.New(en.eng, mcfg)
	if err != nil {
		t.Fatal(err)
	}
	en.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		en.runs.Add(1)
		handler(w, r)
	})))
	t.Cleanup(en.srv.Close)
	return en
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (en *env) do(t *testing.T, method, path, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, en.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := en.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// problem decodes a problem+json answer and checks its type and status.
func problem(t *testing.T, r reply, status int, name string) idemhttp.Problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d (%s), want %d", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Type != idemhttp.ProblemTypeBase+name || p.Status != status || p.Title == "" {
		t.Fatalf("problem %+v, want type %s status %d", p, name, status)
	}
	return p
}

func created(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("Www-Authenticate", "Bearer")
	w.Header().Set("X-Charge-Id", "ch_1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":1,"echo":%q}`, b)
}

func TestReplayReturnsTheStoredResponse(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, nil, created)
	first := en.do(t, "POST", "/orders", `{"amount":10}`, "Idempotency-Key", `"k-1"`)
	if first.status != 201 || first.header.Get("Set-Cookie") == "" || first.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("first: %+v", first)
	}
	again := en.do(t, "POST", "/orders", `{"amount":10}`, "Idempotency-Key", `"k-1"`)
	if again.status != 201 || again.body != first.body || again.header.Get("Location") != "/orders/1" ||
		again.header.Get("Content-Type") != "application/json" || again.header.Get("X-Charge-Id") != "ch_1" ||
		again.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("replay: %+v", again)
	}
	for _, h := range []string{"Set-Cookie", "Www-Authenticate"} {
		if v := again.header.Get(h); v != "" {
			t.Errorf("replay carries %s: %q", h, v)
		}
	}
	if n := en.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	// A bare token is the same key as its quoted form.
	if bare := en.do(t, "POST", "/orders", `{"amount":10}`, "Idempotency-Key", `k-1`); bare.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("bare token: %+v", bare)
	}
}

func TestReplayedHeaders(t *testing.T) {
	t.Parallel()
	handler := func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Charge-Id", "ch_1")
		h.Add("Vary", "Accept")
		h.Add("Vary", "Accept-Encoding")
		h["set-cookie"] = []string{"session=secret"} // not canonical: still never replayed
		h.Set("Authentication-Info", `nextnonce="n"`)
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "named by Connection: hop-by-hop")
		h.Set("Trailer", "X-Checksum")
		w.WriteHeader(201)
		io.WriteString(w, "ok")
		h.Set("X-Checksum", "c") // a trailer, sent after the body
	}
	for _, c := range []struct {
		name      string
		only      []string
		want      map[string]string
		notWanted []string
	}{
		{"default", nil,
			map[string]string{"Content-Type": "application/json", "X-Charge-Id": "ch_1", "Vary": "Accept, Accept-Encoding"},
			[]string{"Set-Cookie", "Authentication-Info", "X-Hop", "X-Checksum"}},
		{"strict", []string{"content-type", "Vary"},
			map[string]string{"Content-Type": "application/json", "Vary": "Accept, Accept-Encoding"},
			[]string{"X-Charge-Id", "Set-Cookie", "Authentication-Info", "X-Hop", "X-Checksum"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			en := setup(t, idem.Config{}, &idemhttp.Config{ReplayHeaders: c.only}, handler)
			first := en.do(t, "POST", "/x", "", "Idempotency-Key", "h")
			if first.header.Get("X-Charge-Id") != "ch_1" || first.header.Get("Set-Cookie") == "" {
				t.Fatalf("first: %+v", first)
			}
			again := en.do(t, "POST", "/x", "", "Idempotency-Key", "h")
			if again.header.Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("not a replay: %+v", again)
			}
			for name, want := range c.want {
				if got := strings.Join(again.header.Values(name), ", "); got != want {
					t.Errorf("replayed %s: %q, want %q", name, got, want)
				}
			}
			for _, name := range c.notWanted {
				if v := again.header.Values(name); len(v) > 0 {
					t.Errorf("replay carries %s: %q", name, v)
				}
			}
		})
	}
}

// A header stored under an earlier, wider policy is not replayed once the
// policy no longer keeps it: the filter runs on the way out too.
func TestReplayFiltersWhatWasStored(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	eng, err := idem.New(mem, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(only []string) *httptest.ResponseRecorder {
		mw, err := idemhttp.New(eng, &idemhttp.Config{ReplayHeaders: only, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/x", nil)
		r.Header.Set("Idempotency-Key", "k")
		mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("X-Charge-Id", "ch_1")
			w.WriteHeader(201)
		})).ServeHTTP(w, r)
		return w
	}
	serve(nil)
	if w := serve(nil); w.Header().Get("X-Charge-Id") != "ch_1" {
		t.Fatalf("default replay: %v", w.Header())
	}
	if w := serve([]string{"Content-Type"}); w.Header().Get("X-Charge-Id") != "" || w.Header().Get("Content-Type") != "text/plain" ||
		w.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("strict replay of a record stored by default: %v", w.Header())
	}
}

func TestClientErrorsAreFinalServerErrorsRelease(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	status.Store(400)
	en := setup(t, idem.Config{}, nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
	})
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "a"); r.status != 400 {
		t.Fatal(r)
	}
	status.Store(201)
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "a"); r.status != 400 || r.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("a 400 is final: %+v", r)
	}
	status.Store(503)
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "b"); r.status != 503 {
		t.Fatal(r)
	}
	status.Store(201)
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "b"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("after a 503 the retry runs: %+v", r)
	}
	if n := en.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

// A 408, 425 or 429 says the request was not run: stored, it would answer
// every retry with "try later" for the whole expiry.
func TestNotRunAnswersReleaseTheKey(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			var status atomic.Int64
			status.Store(int64(code))
			en := setup(t, idem.Config{}, nil, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(int(status.Load()))
			})
			if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "k"); r.status != code {
				t.Fatal(r)
			}
			status.Store(201)
			if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "k"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("after a %d the retry runs: %+v", code, r)
			}
			status.Store(500)
			if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "k"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("the 201 is stored: %+v", r)
			}
			if n := en.runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}

// Config.Release decides over the default, both ways.
func TestReleasePolicyOverridesTheDefault(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	en := setup(t, idem.Config{}, &idemhttp.Config{Release: func(s int) bool { return s == 503 || s == 409 }},
		func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) })
	for _, c := range []struct {
		key          string
		first        int
		replayedWith int // 0: the retry runs
	}{
		{"429-kept", 429, 429},
		{"500-kept", 500, 500},
		{"409-released", 409, 0},
		{"503-released", 503, 0},
	} {
		status.Store(int64(c.first))
		if r := en.do(t, "POST", "/x", "", "Idempotency-Key", c.key); r.status != c.first {
			t.Fatalf("%s: %+v", c.key, r)
		}
		status.Store(201)
		r := en.do(t, "POST", "/x", "", "Idempotency-Key", c.key)
		switch {
		case c.replayedWith != 0 && (r.status != c.replayedWith || r.header.Get(idemhttp.ReplayedHeader) != "true"):
			t.Fatalf("%s: the policy keeps it, retry got %+v", c.key, r)
		case c.replayedWith == 0 && (r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != ""):
			t.Fatalf("%s: the policy releases it, retry got %+v", c.key, r)
		}
	}
}

func TestDefaultRelease(t *testing.T) {
	t.Parallel()
	for s := 100; s < 600; s++ {
		want := s >= 500 || s == 408 || s == 425 || s == 429
		if got := idemhttp.DefaultRelease(s); got != want {
			t.Errorf("DefaultRelease(%d) = %v, want %v", s, got, want)
		}
	}
}

func TestPanicReleasesTheKey(t *testing.T) {
	t.Parallel()
	var panics atomic.Bool
	panics.Store(true)
	en := setup(t, idem.Config{}, nil, func(w http.ResponseWriter, r *http.Request) {
		if panics.Load() {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(201)
	})
	req, _ := http.NewRequest("POST", en.srv.URL+"/x", nil)
	req.Header.Set("Idempotency-Key", "p")
	if resp, err := en.srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("aborted handler answered %d", resp.StatusCode)
	}
	panics.Store(false)
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "p"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("retry after a panic: %+v", r)
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			t.Parallel()
			inside, finish := make(chan struct{}), make(chan struct{})
			var once sync.Once
			en := setup(t, idem.Config{Wait: wait}, nil, func(w http.ResponseWriter, r *http.Request) {
				once.Do(func() { close(inside) })
				<-finish
				w.WriteHeader(201)
				io.WriteString(w, "done")
			})
			const n = 64
			replies := make(chan reply, n)
			var first, dups sync.WaitGroup
			first.Go(func() { replies <- en.do(t, "POST", "/x", "{}", "Idempotency-Key", "dup") })
			<-inside
			for range n - 1 {
				dups.Go(func() { replies <- en.do(t, "POST", "/x", "{}", "Idempotency-Key", "dup") })
			}
			if wait == 0 {
				dups.Wait() // every duplicate is answered 409 while the first runs
			}
			close(finish)
			first.Wait()
			dups.Wait()
			close(replies)
			counts := map[int]int{}
			for r := range replies {
				counts[r.status]++
				if r.status == 409 {
					p := problem(t, r, 409, idemhttp.ProblemInProgress)
					// As long again as the first has run (no time on the
					// engine's clock: at least 100ms), in whole seconds.
					if r.header.Get("Retry-After") != "1" || p.Instance != "/x" {
						t.Errorf("409: Retry-After %q, problem %+v", r.header.Get("Retry-After"), p)
					}
				} else if r.status != 201 || r.body != "done" {
					t.Errorf("reply %+v", r)
				}
			}
			if en.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", en.runs.Load())
			}
			if wait == 0 && counts[409] != n-1 || wait > 0 && counts[201] != n {
				t.Fatalf("statuses %v", counts)
			}
		})
	}
}

func TestReusedKeyWithAnotherRequestIs422(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, &idemhttp.Config{FingerprintHeaders: []string{"X-Account"}}, created)
	en.do(t, "POST", "/orders?dry=0", `{"amount":10}`, "Idempotency-Key", "k", "X-Account", "a")
	for name, r := range map[string]reply{
		"body":   en.do(t, "POST", "/orders?dry=0", `{"amount":11}`, "Idempotency-Key", "k", "X-Account", "a"),
		"query":  en.do(t, "POST", "/orders?dry=1", `{"amount":10}`, "Idempotency-Key", "k", "X-Account", "a"),
		"header": en.do(t, "POST", "/orders?dry=0", `{"amount":10}`, "Idempotency-Key", "k", "X-Account", "b"),
	} {
		t.Run(name, func(t *testing.T) { problem(t, r, 422, idemhttp.ProblemKeyReused) })
	}
	if en.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", en.runs.Load())
	}
	// Another route or method is another key, not a reuse.
	if r := en.do(t, "POST", "/refunds", `{"amount":11}`, "Idempotency-Key", "k"); r.status != 201 {
		t.Fatalf("other route: %+v", r)
	}
}

// A malformed or repeated header reaches Config.ErrorHandler as an
// *idem.KeyError, the one error of key validation, matching
// idem.ErrInvalidKey, and is answered 400 invalid-key.
func TestInvalidKeyIsTheEngineKeyError(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		errs []error
	)
	en := setup(t, idem.Config{}, &idemhttp.Config{Required: true, ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error, p idemhttp.Problem) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		idemhttp.WriteProblem(w, r, p)
	}}, created)
	problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", "a", "Idempotency-Key", "b"), 400, idemhttp.ProblemInvalidKey)
	problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", `"unterminated`), 400, idemhttp.ProblemInvalidKey)
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 2 {
		t.Fatalf("ErrorHandler got %d errors, want 2", len(errs))
	}
	for _, err := range errs {
		var ke *idem.KeyError
		if !errors.As(err, &ke) || ke.Field != clientkey.HeaderField || ke.Reason == "" || !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%v (%T), want an *idem.KeyError about the header matching idem.ErrInvalidKey", err, err)
		}
	}
	if en.runs.Load() != 0 {
		t.Errorf("handler ran %d times", en.runs.Load())
	}
}

func TestBadRequestsAreRefusedBeforeAnyClaim(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, &idemhttp.Config{Required: true, MaxBodyBytes: 100}, created)
	problem(t, en.do(t, "POST", "/x", "{}"), 400, idemhttp.ProblemMissingKey)
	problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", "a", "Idempotency-Key", "a"), 400, idemhttp.ProblemInvalidKey)
	p := problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", `"unterminated`), 400, idemhttp.ProblemInvalidKey)
	if !strings.Contains(p.Detail, "closing quote") {
		t.Errorf("detail %q does not say what is wrong", p.Detail)
	}
	problem(t, en.do(t, "POST", "/x", strings.Repeat("x", 101), "Idempotency-Key", "a"), 413, idemhttp.ProblemBodyTooLarge)
	// A chunked body (no Content-Length) is cut off at the limit too.
	req, _ := http.NewRequest("POST", en.srv.URL+"/x", io.MultiReader(strings.NewReader(strings.Repeat("y", 150))))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "a")
	resp, err := en.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked body over the limit: %d", resp.StatusCode)
	}
	if en.runs.Load() != 0 || en.store.Calls("claim") != 0 {
		t.Fatalf("handler ran %d times, %d claims", en.runs.Load(), en.store.Calls("claim"))
	}
	// Uncovered methods pass through, every time.
	en.do(t, "GET", "/x", "")
	en.do(t, "GET", "/x", "")
	if en.runs.Load() != 2 {
		t.Fatalf("GET ran %d times", en.runs.Load())
	}
}

func TestNoKeyRunsUnprotectedUnlessRequired(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, nil, created)
	en.do(t, "POST", "/x", "{}")
	en.do(t, "POST", "/x", "{}")
	if en.runs.Load() != 2 || en.store.Total() != 0 {
		t.Fatalf("runs %d, store calls %d", en.runs.Load(), en.store.Total())
	}
}

func TestPrincipalsNeverShareResponses(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, &idemhttp.Config{
		Principal: func(r *http.Request) (string, error) {
			if a := r.Header.Get("Authorization"); a != "" {
				return a, nil
			}
			return "", errors.New("no Authorization header")
		},
	}, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "for "+r.Header.Get("Authorization"))
	})
	alice := en.do(t, "POST", "/x", "{}", "Idempotency-Key", "same", "Authorization", "alice")
	bob := en.do(t, "POST", "/x", "{}", "Idempotency-Key", "same", "Authorization", "bob")
	if alice.body != "for alice" || bob.body != "for bob" || bob.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("alice %+v bob %+v", alice, bob)
	}
	if r := en.do(t, "POST", "/x", "{}", "Idempotency-Key", "same", "Authorization", "bob"); r.body != "for bob" || r.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("bob's replay: %+v", r)
	}
	problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", "same"), 401, idemhttp.ProblemUnauthenticated)
	if en.runs.Load() != 2 {
		t.Fatalf("handler ran %d times", en.runs.Load())
	}
}

func TestStoreDownIs503AndTheHandlerDoesNotRun(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{}, &idemhttp.Config{StoreRetryAfter: 5 * time.Second}, created)
	en.store.FailAlways("claim", fmt.Errorf("%w: connection refused", store.ErrUnavailable))
	r := en.do(t, "POST", "/x", "{}", "Idempotency-Key", "k")
	problem(t, r, 503, idemhttp.ProblemStoreUnavailable)
	if r.header.Get("Retry-After") != "5" || en.runs.Load() != 0 {
		t.Fatalf("Retry-After %q, runs %d", r.header.Get("Retry-After"), en.runs.Load())
	}
}

func TestResponseOverTheLimitIsNotReplayedAsGarbage(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("z", 5000)
	en := setup(t, idem.Config{}, &idemhttp.Config{MaxResponseBytes: 4096}, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, big)
	})
	if r := en.do(t, "POST", "/x", "{}", "Idempotency-Key", "k"); r.body != big {
		t.Fatalf("first caller got %d bytes", len(r.body))
	}
	problem(t, en.do(t, "POST", "/x", "{}", "Idempotency-Key", "k"), 410, idemhttp.ProblemResponseNotSaved)
	if en.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", en.runs.Load())
	}
}

func TestLargeBodyIsSpooledAndFingerprintedAlike(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789", 20000) // 200 kB, past the 1 kB memory part
	var got atomic.Value
	en := setup(t, idem.Config{}, &idemhttp.Config{MemoryBodyBytes: 1024, TempDir: t.TempDir()}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		if r.ContentLength != int64(len(body)) {
			t.Errorf("ContentLength %d", r.ContentLength)
		}
		w.WriteHeader(201)
	})
	if r := en.do(t, "POST", "/x", body, "Idempotency-Key", "k"); r.status != 201 || got.Load() != body {
		t.Fatalf("handler did not get the body intact: %+v", r)
	}
	if r := en.do(t, "POST", "/x", body, "Idempotency-Key", "k"); r.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("same body, same fingerprint: %+v", r)
	}
	problem(t, en.do(t, "POST", "/x", body+"!", "Idempotency-Key", "k"), 422, idemhttp.ProblemKeyReused)
}

func TestFlushAndHijackThroughTheCaptureWriter(t *testing.T) {
	t.Parallel()
	flushed := make(chan struct{})
	// Wait: the client of a hijacked connection has its answer before the
	// handler returns and the key is released; a retry then waits for the
	// release instead of getting 409.
	en := setup(t, idem.Config{Wait: time.Hour}, nil, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hijack" {
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
			rw.Flush()
			conn.Close()
			return
		}
		io.WriteString(w, "part1;")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		<-flushed
		io.WriteString(w, "part2")
	})
	req, _ := http.NewRequest("POST", en.srv.URL+"/stream", nil)
	req.Header.Set("Idempotency-Key", "s")
	resp, err := en.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	first := make([]byte, len("part1;"))
	if _, err := io.ReadFull(br, first); err != nil || string(first) != "part1;" {
		t.Fatalf("flushed part: %q %v", first, err)
	}
	close(flushed)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "part2" {
		t.Fatalf("rest %q", rest)
	}
	if r := en.do(t, "POST", "/stream", "", "Idempotency-Key", "s"); r.body != "part1;part2" || r.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("replay of a flushed response: %+v", r)
	}
	// A hijacked connection is not captured: the key is released.
	en.do(t, "POST", "/hijack", "", "Idempotency-Key", "h")
	en.do(t, "POST", "/hijack", "", "Idempotency-Key", "h")
	if en.runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", en.runs.Load())
	}
}

func TestUncertainOutcomeHoldsTheKeyUntilTheLeaseEnds(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	en := setup(t, idem.Config{Lease: 10 * time.Second}, nil, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			if !idemhttp.MarkUncertain(r.Context()) {
				t.Error("MarkUncertain outside the middleware")
			}
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(201)
	})
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "u"); r.status != 504 {
		t.Fatal(r)
	}
	r := en.do(t, "POST", "/x", "", "Idempotency-Key", "u")
	problem(t, r, 409, idemhttp.ProblemInProgress)
	// A kept claim looks like a running one: the duplicate is told to come
	// back as soon as for a holder that has just begun (1s), and is refused
	// again until the lease ends.
	if r.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	en.clock.Advance(9 * time.Second)
	problem(t, en.do(t, "POST", "/x", "", "Idempotency-Key", "u"), 409, idemhttp.ProblemInProgress)
	en.clock.Advance(time.Second)
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "u"); r.status != 201 || runs.Load() != 2 {
		t.Fatalf("after the lease: %+v, runs %d", r, runs.Load())
	}
	if idemhttp.MarkUncertain(context.Background()) {
		t.Fatal("MarkUncertain reported true outside the middleware")
	}
}

func TestErrorHandlerOverridesTheAnswer(t *testing.T) {
	t.Parallel()
	var seen error
	en := setup(t, idem.Config{}, &idemhttp.Config{Required: true,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error, p idemhttp.Problem) {
			seen = err
			p.Detail = "see https://docs.example/idempotency"
			idemhttp.WriteProblem(w, r, p)
		}}, created)
	p := problem(t, en.do(t, "POST", "/x", ""), 400, idemhttp.ProblemMissingKey)
	if p.Detail != "see https://docs.example/idempotency" || !errors.Is(seen, idemhttp.ErrMissingKey) {
		t.Fatalf("problem %+v, error %v", p, seen)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	eng, err := idem.New(memstore.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Store().(*memstore.Store).Close()
	for name, cfg := range map[string]idemhttp.Config{
		"set-cookie":  {ReplayHeaders: []string{"set-cookie"}},
		"date":        {ReplayHeaders: []string{"Content-Type", "date"}},
		"scope":       {Operation: "has space"},
		"method":      {Methods: []string{"post"}},
		"body":        {MaxBodyBytes: -1},
		"response":    {MaxResponseBytes: -1},
		"retry-after": {StoreRetryAfter: -time.Second},
		"body-time":   {BodyTimeout: -time.Second},
	} {
		if _, err := idemhttp.New(eng, &cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := idemhttp.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil engine: %v", err)
	}
}

// FuzzMiddleware sends arbitrary keys, methods and bodies through the
// middleware twice and checks the answers: a problem+json refusal, or the
// handler's response and then its replay, with the handler run at most once.
func FuzzMiddleware(f *testing.F) {
	f.Add("POST", `"k"`, []byte(`{}`), false)
	f.Add("PATCH", `k k`, []byte(``), true)
	f.Add("POST", `"\"`, []byte(`x`), false)
	f.Add("GET", ``, []byte(`y`), true)
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Logger: slog.New(slog.DiscardHandler), RenewInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	var runs atomic.Int64
	// BodyTimeout: a recorder cannot set a read deadline, so the check
	// after every read is what runs.
	mw, err := idemhttp.New(eng, &idemhttp.Config{MaxBodyBytes: 64, BodyTimeout: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(201)
		w.Write(b)
	}))
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, method, key string, body []byte, twoHeaders bool) {
		if method != "POST" && method != "PATCH" && method != "GET" {
			method = "POST"
		}
		// A fresh key space per input, so that inputs do not replay each other.
		path := fmt.Sprintf("/f/%d", seq.Add(1))
		send := func() *httptest.ResponseRecorder {
			r := httptest.NewRequest(method, path, bytes.NewReader(body))
			r.Header.Set("Idempotency-Key", key)
			if twoHeaders {
				r.Header.Add("Idempotency-Key", key)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		before := runs.Load()
		a, b := send(), send()
		ran := runs.Load() - before
		_, perr := idemhttp.ParseHeader(map[bool][]string{false: {key}, true: {key, key}}[twoHeaders])
		switch {
		case method == "GET":
			if ran != 2 {
				t.Fatalf("GET ran %d times", ran)
			}
		case perr != nil || len(body) > 64:
			if a.Code != 400 && a.Code != 413 || a.Header().Get("Content-Type") != "application/problem+json" || ran != 0 {
				t.Fatalf("refusal: %d %q, ran %d", a.Code, a.Body, ran)
			}
		default:
			if a.Code != 201 || b.Code != 201 || ran != 1 || !bytes.Equal(a.Body.Bytes(), body) || !bytes.Equal(b.Body.Bytes(), body) ||
				b.Header().Get(idemhttp.ReplayedHeader) != "true" {
				t.Fatalf("first %d %q, second %d %q, ran %d", a.Code, a.Body, b.Code, b.Body, ran)
			}
		}
	})
}

// Under the takeover policy Hold, a request whose holder stopped renewing
// (RenewInterval < 0 here, as a dead holder does) is not run again after
// the lease: a retry is answered 409 with the problem type "held" and no
// Retry-After, and the handler does not run. When the holder finishes
// after all, its response is the key's, and retries replay it.
func TestHeldKeyIsAnswered409Held(t *testing.T) {
	t.Parallel()
	inside, finish := make(chan struct{}), make(chan struct{})
	en := setup(t, idem.Config{Lease: 10 * time.Second}, &idemhttp.Config{HoldCrashed: true}, func(w http.ResponseWriter, r *http.Request) {
		close(inside)
		<-finish
		w.WriteHeader(201)
	})
	first := make(chan reply, 1)
	go func() { first <- en.do(t, "POST", "/x", "", "Idempotency-Key", "h") }()
	<-inside
	en.clock.Advance(10 * time.Second)
	r := en.do(t, "POST", "/x", "", "Idempotency-Key", "h")
	p := problem(t, r, 409, idemhttp.ProblemHeld)
	if r.header.Get("Retry-After") != "" || p.RetryAfter != 0 {
		t.Fatalf("held key answered with Retry-After %q: %+v", r.header.Get("Retry-After"), p)
	}
	close(finish)
	if r := <-first; r.status != 201 {
		t.Fatalf("the late holder: %+v", r)
	}
	if r := en.do(t, "POST", "/x", "", "Idempotency-Key", "h"); r.status != 201 || r.header.Get(idemhttp.ReplayedHeader) != "true" || en.runs.Load() != 1 {
		t.Fatalf("after the holder finished: %+v, runs %d", r, en.runs.Load())
	}
}
