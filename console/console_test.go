package console_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secret = "correct-horse-battery"

// fixture is a seeded memstore, an application engine on it, and a
// console over it, on one manual clock.
type fixture struct {
	t       *testing.T
	clock   *clocktest.Clock
	app     *idem.Engine
	keys    consoletest.Keys
	console *console.Console
	srv     *httptest.Server
	logs    *syncBuffer
	hold    time.Duration // the console's SignInUserDelay
	mu      sync.Mutex
	events  []console.ActionEvent
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func setup(t *testing.T, cfg console.Config) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: clocktest.New(time.Now().Truncate(time.Second)), logs: &syncBuffer{}}
	s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: f.clock})
	t.Cleanup(func() { s.Close() })
	var err error
	if f.app, err = idem.New(s, &idem.Config{Clock: f.clock, Owner: "worker-7", Expiry: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	raw, err := idem.New(s, &idem.Config{Clock: f.clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f.keys = consoletest.Seed(t, f.app, raw, f.clock.Advance)
	cfg.Clock = f.clock
	f.hold = cfg.SignInUserDelay
	if f.hold == 0 {
		f.hold = time.Second
	}
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	cfg.OnAction = func(ev console.ActionEvent) {
		f.mu.Lock()
		f.events = append(f.events, ev)
		f.mu.Unlock()
	}
	if f.console, err = console.New(s, &cfg); err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.console)
	t.Cleanup(func() {
		f.srv.Close()
		f.console.Close()
	})
	return f
}

// writable is a console with writes on, and a signed-in client.
func writable(t *testing.T) (*fixture, *consoletest.Client) {
	f := setup(t, console.Config{Write: true, Credentials: []console.Credential{{User: "ops", Secret: secret}}})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	c.SignIn("ops", secret)
	return f, c
}

func rec(k idem.StoreKey) string { return "record?" + url.Values{"key": {k.String()}}.Encode() }

func (f *fixture) state(k idem.StoreKey) *idem.State {
	st, err := f.app.Status(context.Background(), k)
	if errors.Is(err, idem.ErrNotFound) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

func TestEveryPageRenders(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{Name: "memory:"})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	for path, want := range map[string][]string{
		"":                              {"Overview", "Stuck", ">1</a>", "charge", "refund", "Last monitor sweep", "read-only"},
		"records":                       {f.keys.Completed.String(), f.keys.Failed.String(), f.keys.Stuck.String(), f.keys.Fresh.String()},
		"records?stuck=1":               {f.keys.Stuck.String(), "(stuck)", "arn:aws:states:"},
		"records?status=failed":         {f.keys.Failed.String()},
		"records?scope=refund&older=1m": {f.keys.Failed.String()},
		"records?scope=charge/acme":     {f.keys.Completed.String(), f.keys.Fresh.String()},
		rec(f.keys.Completed):           {"COMPLETED", "&#34;charge&#34;: &#34;ch_1001&#34;", "JSON,", "Fingerprint"},
		rec(f.keys.Failed):              {"FAILED", "declined", "card declined by issuer"},
		rec(f.keys.Stuck):               {"stuck: past its expected completion", "https://eu-west-1.console.aws.amazon.com/states/home?region=eu-west-1#/v2/executions/details/arn:aws:states:eu-west-1:123456789012:execution:charge-card:order-1003", "read-only"},
		rec(f.keys.Fresh):               {"within its expected completion"},
		rec(f.keys.Binary):              {"binary (hex)", "300 bytes", "00 01 02 03"},
		"static/console.css":            {"idem console"},
	} {
		code, body, h := c.Get(path)
		if code != http.StatusOK {
			t.Errorf("GET /%s: %d\n%s", path, code, body)
			continue
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("GET /%s: no %q in\n%s", path, w, body)
			}
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
			t.Errorf("GET /%s: Content-Security-Policy %q", path, csp)
		}
		if strings.Contains(body, "<form method=\"post\" action=\"/confirm\"") {
			t.Errorf("GET /%s: a read-only console shows an action form", path)
		}
	}
	if code, _, _ := c.Get("nope"); code != http.StatusNotFound {
		t.Errorf("unknown page: %d", code)
	}
}

// An operation that recorded two steps (a result, then a terminal error)
// and failed is left IN_PROGRESS with both: the record page shows them as
// a table, in the order they ran, with when each was recorded and its
// result's size or its error, every value escaped. A record without
// steps has no such table.
func TestRecordShowsSteps(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	start := f.clock.Now()
	key := consoletest.LeftWithSteps(t, f.app, "order-7", func() { f.clock.Advance(2 * time.Second) }, "no <script>mailbox</script>")
	code, body, _ := c.Get(rec(key))
	if code != http.StatusOK || !strings.Contains(body, "Finished steps") || !strings.Contains(body, `<table class="steps">`) {
		t.Fatalf("record page: %d, no step table:\n%s", code, body)
	}
	rows := regexp.MustCompile(`(?s)<tr data-step="(\d+)">(.*?)</tr>`).FindAllStringSubmatch(body, -1)
	at := func(d time.Duration) string { return start.Add(d).UTC().Format("2006-01-02 15:04:05Z") }
	want := [][]string{
		{"0", "<td>0</td>", "<code>charge</code>", "<td>" + at(0) + "</td>", "result, 6 bytes"},
		{"1", "<td>1</td>", "<code>email</code>", "<td>" + at(2*time.Second) + "</td>", "error <code>bounced</code>: no &lt;script&gt;mailbox&lt;/script&gt;"},
	}
	if len(rows) != len(want) {
		t.Fatalf("the step table has %d rows, want %d:\n%s", len(rows), len(want), body)
	}
	for i, w := range want {
		if rows[i][1] != w[0] {
			t.Errorf("row %d is step %s, want %s", i, rows[i][1], w[0])
		}
		for _, part := range w[1:] {
			if !strings.Contains(rows[i][2], part) {
				t.Errorf("step %s lacks %q:\n%s", w[0], part, rows[i][2])
			}
		}
	}
	if strings.Contains(body, "<script>") {
		t.Errorf("markup from a step reached the page:\n%s", body)
	}

	if _, body, _ := c.Get(rec(f.keys.Stuck)); strings.Contains(body, "Finished steps") || strings.Contains(body, "data-step") {
		t.Errorf("a record without steps shows a step table:\n%s", body)
	}
}

// Keys, results and errors are untrusted: a record whose result and
// tenant hold markup renders it as text.
func TestScriptRendersInert(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	for _, path := range []string{rec(f.keys.Script), "records", "records?scope=" + url.QueryEscape(f.keys.Script.Scope())} {
		code, body, _ := c.Get(path)
		if code != http.StatusOK {
			t.Fatalf("GET /%s: %d", path, code)
		}
		if strings.Contains(body, "<script") || strings.Contains(body, "<img") {
			t.Errorf("GET /%s: markup from a record reached the page:\n%s", path, body)
		}
		if !strings.Contains(body, "&lt;script&gt;") {
			t.Errorf("GET /%s: the escaped script is not shown:\n%s", path, body)
		}
	}
}

func TestBadInputIsNamed(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	for path, want := range map[string]string{
		"records?status=done":           "status=&#34;done&#34;",
		"records?stuck=yes":             "stuck=&#34;yes&#34;",
		"records?stuck=1&status=failed": "only IN_PROGRESS records are stuck",
		"records?limit=0":               "limit=&#34;0&#34;",
		"records?older=soon":            "older=&#34;soon&#34;",
		"records?scope=a%20b":           "scope=",
		"record":                        "key: missing",
		"record?key=nohash":             "is not a store key",
	} {
		code, body, _ := c.Get(path)
		if code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("GET /%s: %d, want 400 naming %q:\n%s", path, code, want, body)
		}
	}
	if code, body, _ := c.Get(rec(mustKey(t, "charge", "absent"))); code != http.StatusNotFound || !strings.Contains(body, "No live record") {
		t.Errorf("absent record: %d\n%s", code, body)
	}
}

func mustKey(t *testing.T, op, material string) idem.StoreKey {
	k, err := idem.NewStoreKey(op, "", []byte(material))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestWritesNeedCredentials(t *testing.T) {
	t.Parallel()
	if _, err := console.New(memstore.New(&memstore.Config{SweepInterval: -1}), &console.Config{Write: true}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("writes without credentials: %v", err)
	}
	f, c := writable(t)
	// A signed-in operator's forms, posted without the session, without
	// the CSRF token, or with another one, change nothing.
	_, body, _ := c.Get(rec(f.keys.Stuck))
	form := consoletest.Hidden(body, "action", "release")
	anon := consoletest.NewClient(t, f.srv.URL+"/")
	if code, body, _ := anon.Post("act", form); code != http.StatusUnauthorized {
		t.Errorf("act without a session: %d\n%s", code, body)
	}
	if code, _, loc := anon.Get(rec(f.keys.Stuck)); code != http.StatusSeeOther || !strings.HasSuffix(loc.Get("Location"), "/login") {
		t.Errorf("reading without a session: %d %v", code, loc)
	}
	noCSRF := url.Values{}
	for k, v := range form {
		if k != "csrf" {
			noCSRF[k] = v
		}
	}
	if code, body, _ := c.Post("act", noCSRF); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
		t.Errorf("act without the CSRF token: %d\n%s", code, body)
	}
	noCSRF.Set("csrf", "forged")
	if code, _, _ := c.Post("confirm", noCSRF); code != http.StatusForbidden {
		t.Errorf("confirm with a wrong CSRF token: %d", code)
	}
	if st := f.state(f.keys.Stuck); st == nil || st.Status != idem.StatusInProgress {
		t.Fatalf("a refused write changed the record: %+v", st)
	}
	if err := anon.TrySignIn("ops", "wrong-password-here"); err == nil {
		t.Error("a wrong password signed in")
	}
	if err := anon.TrySignIn("", secret); err == nil {
		t.Error("a password signed in as a token")
	}
	// The session cookie is HttpOnly and SameSite=Strict.
	code, _, h := consoletest.NewClient(t, f.srv.URL+"/").PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, nil)
	if code != http.StatusSeeOther || !strings.Contains(h.Get("Set-Cookie"), "HttpOnly") || !strings.Contains(h.Get("Set-Cookie"), "SameSite=Strict") {
		t.Errorf("session cookie: %d %q", code, h.Get("Set-Cookie"))
	}
	// A read-only console refuses writes whoever asks.
	ro := setup(t, console.Config{Credentials: []console.Credential{{Secret: secret}}})
	rc := consoletest.NewClient(t, ro.srv.URL+"/")
	rc.SignIn("", secret)
	_, body, _ = rc.Get(rec(ro.keys.Stuck))
	if strings.Contains(body, `action="/confirm"`) {
		t.Error("a read-only console shows action forms")
	}
	f2 := consoletest.Hidden(body, "", "") // the sign-out form carries the CSRF token
	f2.Set("key", ro.keys.Stuck.String())
	f2.Set("action", "release")
	f2.Set("guard", "x")
	if code, body, _ := rc.Post("act", f2); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("act on a read-only console: %d\n%s", code, body)
	}
}

// The acceptance path: a stuck record resolved with a result is
// COMPLETED, a retry replays the resolved result, and the action is
// logged and reported.
func TestResolveStuckRecord(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	_, body, _ := c.Get(rec(f.keys.Stuck))
	f2 := consoletest.Hidden(body, "action", "complete")
	f2.Set("result", `{"charge":"ch_1003","by":"hand"}`)
	code, body, _ := c.Post("confirm", f2)
	if code != http.StatusOK || !strings.Contains(body, "becomes COMPLETED") || !strings.Contains(body, "IN_PROGRESS (fence 1") {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	if st := f.state(f.keys.Stuck); st.Status != idem.StatusInProgress {
		t.Fatal("the confirmation page wrote")
	}
	code, _, loc := c.Post("act", consoletest.Hidden(body, "action", "complete"))
	if code != http.StatusSeeOther || !strings.Contains(loc, "done=complete") {
		t.Fatalf("act: %d %s", code, loc)
	}
	_, body, _ = c.Get(strings.TrimPrefix(loc, "/"))
	if !strings.Contains(body, "Resolved as COMPLETED") || !strings.Contains(body, "ch_1003") {
		t.Fatalf("after: %s", body)
	}
	res, err := idem.Do(context.Background(), f.app, idem.Request{Operation: "charge", Tenant: "acme", Key: "order-1003"},
		func(context.Context) (map[string]string, error) { return nil, errors.New("the operation ran again") })
	if err != nil || !res.Replayed || res.Value["charge"] != "ch_1003" {
		t.Fatalf("retry: %+v %v", res, err)
	}
	f.mu.Lock()
	evs := f.events
	f.mu.Unlock()
	if len(evs) != 1 || evs[0].Who != "ops" || evs[0].Action != ops.Complete || evs[0].Before != idem.StatusInProgress ||
		evs[0].After != idem.StatusCompleted || evs[0].Outcome != "done" {
		t.Fatalf("events: %+v", evs)
	}
	if l := f.logs.String(); !strings.Contains(l, "idem console: action done") || !strings.Contains(l, "who=ops") ||
		!strings.Contains(l, "before=IN_PROGRESS") || !strings.Contains(l, "after=COMPLETED") {
		t.Fatalf("log: %s", l)
	}
}

func TestOtherActions(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	// Fail a stuck record, release the FAILED one, delete a COMPLETED one.
	if code, loc := c.Act(f.keys.Stuck, "fail", url.Values{"code": {"timeout"}, "message": {"gave up"}, "expiry": {"1h"}}); code != http.StatusSeeOther {
		t.Fatalf("fail: %d %s", code, loc)
	}
	if st := f.state(f.keys.Stuck); st.Status != idem.StatusFailed || st.Err.Code != "timeout" || !st.ExpiresAt.Equal(f.clock.Now().Add(time.Hour)) {
		t.Fatalf("after fail: %+v", st)
	}
	if code, loc := c.Act(f.keys.Failed, "release", nil); code != http.StatusSeeOther {
		t.Fatalf("release: %d %s", code, loc)
	}
	if code, loc := c.Act(f.keys.Completed, "delete", nil); code != http.StatusSeeOther {
		t.Fatalf("delete: %d %s", code, loc)
	}
	if f.state(f.keys.Failed) != nil || f.state(f.keys.Completed) != nil {
		t.Fatal("released or deleted records remain")
	}
	// A COMPLETED record has no release form; a forged one is refused.
	_, body, _ := c.Get(rec(f.keys.Script))
	if consoletest.Hidden(body, "action", "release") != nil {
		t.Error("a COMPLETED record offers release")
	}
	form := consoletest.Hidden(body, "action", "delete")
	form.Set("action", "release")
	if code, body, _ := c.Post("confirm", form); code != http.StatusConflict || !strings.Contains(body, "use delete") {
		t.Errorf("release of COMPLETED: %d\n%s", code, body)
	}
	// Bad form values are named.
	for field, v := range map[string]url.Values{
		"result: not valid JSON": {"action": {"complete"}, "result": {"{nope"}},
		"code and message":       {"action": {"fail"}, "code": {"x"}},
		"expiry=":                {"action": {"delete"}, "expiry": {"-1h"}},
		"action: unknown":        {"action": {"purge"}},
	} {
		form := consoletest.Hidden(body, "action", "delete")
		for k, vv := range v {
			form[k] = vv
		}
		if code, body, _ := c.Post("confirm", form); code != http.StatusBadRequest || !strings.Contains(body, strings.ReplaceAll(field, `"`, "&#34;")) {
			t.Errorf("%v: %d, want 400 naming %q\n%s", v, code, field, body)
		}
	}
}

// A fresh IN_PROGRESS record needs force; a record that changed after
// the page was read is refused and left as it is.
func TestGuards(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	if code, body := c.Act(f.keys.Fresh, "release", nil); code != http.StatusConflict || !strings.Contains(body, "within its expected completion") {
		t.Fatalf("release of a fresh claim: %d\n%s", code, body)
	}
	if code, loc := c.Act(f.keys.Fresh, "release", url.Values{"force": {"1"}}); code != http.StatusSeeOther {
		t.Fatalf("forced release: %d %s", code, loc)
	}
	if f.state(f.keys.Fresh) != nil {
		t.Fatal("forced release left the record")
	}
	// The operator opens the stuck record and confirms; meanwhile the
	// holder's work finishes.
	_, body, _ := c.Get(rec(f.keys.Stuck))
	form := consoletest.Hidden(body, "action", "complete")
	form.Set("result", `"by hand"`)
	_, confirm, _ := c.Post("confirm", form)
	st := f.state(f.keys.Stuck)
	if err := f.app.Complete(context.Background(), st.Token(), "by the holder"); err != nil {
		t.Fatal(err)
	}
	code, body, _ := c.Post("act", consoletest.Hidden(confirm, "action", "complete"))
	if code != http.StatusConflict || !strings.Contains(body, "changed underneath") || !strings.Contains(body, "Nothing was written") {
		t.Fatalf("act on a changed record: %d\n%s", code, body)
	}
	if st := f.state(f.keys.Stuck); st.Status != idem.StatusCompleted || string(st.Result) != `"by the holder"` {
		t.Fatalf("the holder's outcome was overwritten: %+v", st)
	}
	f.mu.Lock()
	last := f.events[len(f.events)-1]
	f.mu.Unlock()
	if last.Outcome != "refused" || last.Action != ops.Complete {
		t.Fatalf("refusal event: %+v", last)
	}
}

// Listing pages with the store's cursor, a page at a time.
func TestListPages(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{PageSize: 4})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	ctx := context.Background()
	for i := range 7 {
		if _, err := idem.Do(ctx, f.app, idem.Request{Operation: "bulk", Key: fmt.Sprint(i)}, func(context.Context) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	path := "records?scope=bulk"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatal("too many pages")
		}
		code, body, _ := c.Get(path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		n := strings.Count(body, `<td class="key">`)
		if n > 4 {
			t.Fatalf("page of %d records, limit 4", n)
		}
		for _, line := range strings.Split(body, `<td class="key"><a href="`)[1:] {
			k, _, _ := strings.Cut(strings.SplitN(line, ">", 2)[1], "<")
			if seen[k] {
				t.Fatalf("%s listed twice", k)
			}
			seen[k] = true
		}
		if !strings.Contains(body, `rel="next"`) {
			path = ""
		} else {
			i := strings.Index(body, `rel="next"`)
			j := strings.LastIndex(body[:i], `href="/`)
			q, _, _ := strings.Cut(body[j+len(`href="/`):], `"`)
			path = strings.ReplaceAll(q, "&amp;", "&")
		}
	}
	if len(seen) != 7 {
		t.Fatalf("listed %d bulk records, want 7", len(seen))
	}
}

func TestRefLinkAndCredentials(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{RefLink: "https://runs.example.com/{ref}"})
	ctx := context.Background()
	b, err := f.app.Begin(ctx, idem.Request{Operation: "job", Key: "j"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.app.Attach(ctx, b.Token, "run 42/a"); err != nil {
		t.Fatal(err)
	}
	c := consoletest.NewClient(t, f.srv.URL+"/")
	if _, body, _ := c.Get(rec(b.Token.Key)); !strings.Contains(body, `href="https://runs.example.com/run&#43;42%2Fa"`) {
		t.Errorf("ref link missing:\n%s", body)
	}
	creds, err := console.ParseCredentials(strings.NewReader("# operators\nalice:correct-horse-1\n\nlong-random-token-1\n"))
	if err != nil || len(creds) != 2 || creds[0].User != "alice" || creds[1].User != "" {
		t.Fatalf("ParseCredentials: %+v %v", creds, err)
	}
	for _, bad := range []string{"", ":nouser-secret", "bob:", "bob:short"} {
		if _, err := console.ParseCredentials(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseCredentials(%q) accepted", bad)
		}
	}
}

// When the monitor's sweep stops at its record limit, every count on the
// overview says, next to the number, that it is a lower bound; when it
// read everything, none does.
func TestOverviewSaysWhenCountsAreLowerBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max   int
		bound bool
	}{{max: 1, bound: true}, {max: 0, bound: false}} {
		clock := clocktest.New(time.Now().Truncate(time.Second))
		s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: clock})
		t.Cleanup(func() { s.Close() })
		app, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		consoletest.Seed(t, app, nil, clock.Advance)
		m, err := monitor.New(s, &monitor.Config{Clock: clock, MaxRecords: tc.max, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		con, err := console.New(s, &console.Config{Monitor: m, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(con)
		_, body, _ := consoletest.NewClient(t, srv.URL+"/").Get("")
		srv.Close()
		con.Close()
		if got := strings.Contains(body, "≥ ") && strings.Contains(body, "lower bounds"); got != tc.bound {
			t.Errorf("MaxRecords %d: lower bounds shown %v, want %v\n%s", tc.max, got, tc.bound, body)
		}
		if tc.bound && strings.Count(body, `>≥ 1</a>`) < 2 {
			t.Errorf("the cards do not mark their counts:\n%s", body)
		}
	}
}

// "Was my customer charged twice?": the record page shows a response
// idemhttp (or the gateway) stored as the response it was, status line,
// header and a JSON body as indented JSON, not the record's base64; a text
// body stays inert text.
func TestRecordShowsStoredHTTPResponse(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	serve := func(key string, h http.HandlerFunc) idem.StoreKey {
		mw, err := idemhttp.New(f.app, &idemhttp.Config{Operation: "charges"})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
		r.Header.Set(idemhttp.HeaderName, key)
		mw.Handler(h).ServeHTTP(httptest.NewRecorder(), r)
		sk, err := clientkey.HTTP("charges", "", http.MethodPost, "/charges", key)
		if err != nil {
			t.Fatal(err)
		}
		return sk
	}
	jsonKey := serve("order-42", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":"ch_1","amount":500}`)
	})
	textKey := serve("order-43", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `paid <script>alert(1)</script>`)
	})

	code, page, _ := c.Get(rec(jsonKey))
	if code != http.StatusOK {
		t.Fatalf("GET record: %d\n%s", code, page)
	}
	for _, want := range []string{
		`data-kind="HTTP 201 response, body JSON"`,
		"HTTP 201 Created\nContent-Type: application/json\n\n{\n  &#34;charge&#34;: &#34;ch_1&#34;,\n  &#34;amount&#34;: 500\n}",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("record page lacks %q:\n%s", want, page)
		}
	}
	if b64 := base64.StdEncoding.EncodeToString([]byte(`{"charge"`))[:8]; strings.Contains(page, b64) {
		t.Errorf("record page shows the body in base64 (%s):\n%s", b64, page)
	}

	code, page, _ = c.Get(rec(textKey))
	if code != http.StatusOK {
		t.Fatalf("GET record: %d\n%s", code, page)
	}
	if !strings.Contains(page, `data-kind="HTTP 200 response, body text"`) || !strings.Contains(page, "paid &lt;script&gt;alert(1)&lt;/script&gt;") || strings.Contains(page, "<script>alert") {
		t.Errorf("text body not shown as inert text:\n%s", page)
	}
}

// A key held for an operator (the takeover policy Hold, its holder gone)
// shows as held on the overview, in the list and on its record page, and
// the operator settles it from there: released, the next call runs.
func TestHeldKeyIsShownAndSettled(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	ctx := context.Background()
	b, err := f.app.Begin(ctx, idem.Request{Operation: "charge", Tenant: "acme", Key: "order-held", HoldCrashed: true}, &idem.BeginOptions{ExpectedCompletion: time.Minute})
	if err != nil || !b.Acquired {
		t.Fatalf("begin: %+v %v", b, err)
	}
	f.clock.Advance(2 * time.Minute)
	for path, want := range map[string]string{
		"":                `<span data-field="held">1 held</span>`,
		"records?stuck=1": `<span data-field="held">held</span>`,
		rec(b.Token.Key):  `<span data-field="held">held for an operator`,
	} {
		if code, body, _ := c.Get(path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("%q: %d, want %q in\n%s", path, code, want, body)
		}
	}
	if code, _ := c.Act(b.Token.Key, "release", nil); code != http.StatusSeeOther {
		t.Fatalf("release: %d", code)
	}
	ran := false
	if _, err := idem.Do(ctx, f.app, idem.Request{Operation: "charge", Tenant: "acme", Key: "order-held"}, func(context.Context) (int, error) { ran = true; return 1, nil }); err != nil || !ran {
		t.Fatalf("after the release: %v, ran %v", err, ran)
	}
}

// The confirmation of an operator's write to a record with finished steps
// says what becomes of them: settled (complete, fail), the steps not yet
// run never run; released, the next call runs every step again.
func TestConfirmSaysWhatBecomesOfTheSteps(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	key := consoletest.LeftWithSteps(t, f.app, "order-steps", nil, "mailbox full")
	_, page, _ := c.Get(rec(key))
	for action, after := range map[string]string{
		"release":  "none: the next call runs every step again, these too",
		"complete": "none: the steps not yet run never run",
	} {
		form := consoletest.Hidden(page, "action", action)
		if action == "complete" {
			form.Set("result", `{"settled":"by hand"}`)
		}
		code, body, _ := c.Post("confirm", form)
		if code != http.StatusOK || !strings.Contains(body, `<td data-field="steps">2: <code>charge</code>, <code>email</code></td>`) || !strings.Contains(body, after) {
			t.Errorf("confirm %s: %d, want the two steps and %q:\n%s", action, code, after, body)
		}
	}
	if st := f.state(key); st == nil || len(st.Steps) != 2 {
		t.Fatalf("the confirmation pages wrote: %+v", st)
	}
}
