package command

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

func TestShow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)

	out := f.must("show", keys["stuck"].String())
	for _, want := range []string{"status:", "IN_PROGRESS (stuck: past its expected completion)", "owner:", "worker-7/", "execution ref:", "arn:aws:states:exec:a", "age:", "2m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	out = f.must("show", "--scope", "refund", "--key", "c")
	if !strings.Contains(out, "error code:") || !strings.Contains(out, "declined") || !strings.Contains(out, "card declined") {
		t.Errorf("show failed record:\n%s", out)
	}
	var v view
	if err := json.Unmarshal([]byte(f.must("show", "-o", "json", "--scope", "charge", "--tenant", "t1", "--key", "d")), &v); err != nil {
		t.Fatal(err)
	}
	var result struct{ ID int }
	if err := json.Unmarshal(v.Result, &result); err != nil || result.ID != 7 {
		t.Fatalf("result %s: %v", v.Result, err)
	}
	if v.Status != "COMPLETED" || v.Key != keys["completed"].String() {
		t.Fatalf("%+v", v)
	}
	if f.must("show", "--scope", "charge/t1", "--key", "d") != f.must("show", keys["completed"].String()) {
		t.Fatal("--scope NAME/TENANT and the store key differ")
	}
	code, out, errOut := f.run("show", "--scope", "charge", "--key", "nope")
	if code != ExitNotFound || out != "" || !strings.Contains(errOut, "no such record") {
		t.Fatalf("absent key: exit %d, %q %q", code, out, errOut)
	}
}

// serveOnce runs one POST with Idempotency-Key key through idemhttp under
// operation, answered by h, and returns the record's store key.
func (f *fixture) serveOnce(operation, key string, h http.HandlerFunc) idem.StoreKey {
	f.t.Helper()
	mw, err := idemhttp.New(f.app, &idemhttp.Config{Operation: operation})
	if err != nil {
		f.t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
	r.Header.Set(idemhttp.HeaderName, key)
	mw.Handler(h).ServeHTTP(httptest.NewRecorder(), r)
	sk, err := clientkey.HTTP(operation, "", http.MethodPost, "/charges", key)
	if err != nil {
		f.t.Fatal(err)
	}
	return sk
}

// "Was my customer charged twice?": a response idemhttp (or the gateway)
// stored is shown with its body as sent, a JSON body as JSON, never the
// record's base64; any other body, and any other result, safely: one
// line, terminal escapes written out.
func TestShowStoredHTTPResponse(t *testing.T) {
	t.Parallel()
	f := setup(t)
	charged := f.serveOnce("charges", "order-42", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "{\"charge\": \"ch_1\",\n \"amount\": 500}")
	})
	out := f.must("show", charged.String())
	for _, want := range []string{
		"result:", "HTTP 201 response",
		"response header:", "Content-Type: application/json",
		`response body:`, `{"charge":"ch_1","amount":500}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, base64.StdEncoding.EncodeToString([]byte(`{"charge"`))[:8]) {
		t.Errorf("show prints the body in base64:\n%s", out)
	}
	var v view
	if err := json.Unmarshal([]byte(f.must("show", "-o", "json", charged.String())), &v); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Charge string
		Amount int
	}
	if v.Response == nil || v.Response.Status != 201 || json.Unmarshal(v.Response.Body, &body) != nil || body.Charge != "ch_1" || body.Amount != 500 {
		t.Fatalf("show -o json: response %+v, body %s", v.Response, v.Response.Body)
	}

	// A text body with a terminal escape, and a result that is no response.
	text := f.serveOnce("charges", "order-43", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "paid\x1b[2J\r\nagain \xc2\x9b")
	})
	tok, raw := f.begin("charge", "e", time.Minute, "")
	if err := f.app.Complete(context.Background(), tok, []byte("ok\x1b]0;owned\x07\n{")); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[idem.StoreKey][2]string{
		text: {"response body:", `"paid\u001b[2J\r\nagain \u009b"`},
		raw:  {"result:", `"ok\u001b]0;owned\u0007\n{"`},
	} {
		out := f.must("show", k.String())
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want[0]) + ` +` + regexp.QuoteMeta(want[1]) + `$`).MatchString(out) {
			t.Errorf("show lacks %s %s:\n%s", want[0], want[1], out)
		}
		for _, c := range out {
			if c != '\n' && unicode.IsControl(c) {
				t.Errorf("show prints control character %U:\n%q", c, out)
			}
		}
	}
}

// "How far did it get?": an operation that recorded two steps (a result,
// then a terminal error) and then failed is left IN_PROGRESS with both,
// its lease ended. show lists them in the order they ran, with when each
// was recorded and its outcome's size or error code, in the table and in
// -o json; over memstore, and over a bolt file idemctl opens read-only
// after the application closed it. A record without steps shows none.
func TestShowSteps(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, clock *clocktest.Clock, app *idem.Engine) idem.StoreKey {
		t.Helper()
		return consoletest.LeftWithSteps(t, app, "order-7", func() { clock.Advance(1500 * time.Millisecond) }, "no such mailbox\x1b[2J")
	}
	check := func(t *testing.T, f *fixture, key idem.StoreKey, start time.Time) {
		t.Helper()
		out := f.must("show", key.String())
		first, second := start.UTC().Format(time.RFC3339), start.Add(1500*time.Millisecond).UTC().Format(time.RFC3339)
		lines := regexp.MustCompile(`(?m)^(steps|step \d+):.*$`).FindAllString(out, -1)
		want := []string{
			`^steps: +2 finished \(a takeover resumes after them\)$`,
			`^step 0: +charge +` + regexp.QuoteMeta(first) + ` +result, 6 bytes$`,
			`^step 1: +email +` + regexp.QuoteMeta(second) + ` +error bounced: no such mailbox\\u001b\[2J$`,
		}
		if len(lines) != len(want) {
			t.Fatalf("show prints %d step lines, want %d:\n%s", len(lines), len(want), out)
		}
		for i, w := range want {
			if !regexp.MustCompile(w).MatchString(lines[i]) {
				t.Errorf("line %q does not match %s:\n%s", lines[i], w, out)
			}
		}
		if !strings.Contains(out, "IN_PROGRESS (stuck") {
			t.Errorf("show's status:\n%s", out)
		}

		var v view
		if err := json.Unmarshal([]byte(f.must("show", "-o", "json", key.String())), &v); err != nil {
			t.Fatal(err)
		}
		if len(v.Steps) != 2 {
			t.Fatalf("show -o json: steps %+v, want 2", v.Steps)
		}
		charge, email := v.Steps[0], v.Steps[1]
		if charge.Index != 0 || charge.Name != "charge" || !charge.Recorded.Equal(start) || charge.Outcome != "result" ||
			charge.ResultBytes == nil || *charge.ResultBytes != len(`"ch_1"`) || charge.Error != nil {
			t.Errorf("step 0: %+v", charge)
		}
		if email.Index != 1 || email.Name != "email" || !email.Recorded.Equal(start.Add(1500*time.Millisecond)) || email.Outcome != "error" ||
			email.ResultBytes != nil || email.Error == nil || email.Error.Code != "bounced" || email.Error.Message != "no such mailbox\x1b[2J" {
			t.Errorf("step 1: %+v %+v", email, email.Error)
		}
	}

	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		start := f.clock.Now()
		key := run(t, f.clock, f.app)
		check(t, f, key, start)

		plain := population(f)["stuck"]
		out := f.must("show", plain.String())
		if strings.Contains(out, "step") {
			t.Errorf("a record without steps shows steps:\n%s", out)
		}
		if js := f.must("show", "-o", "json", plain.String()); strings.Contains(js, `"steps"`) {
			t.Errorf("a record without steps has steps in -o json:\n%s", js)
		}
	})
	t.Run("bolt", func(t *testing.T) {
		t.Parallel()
		url := "bolt://" + filepath.Join(t.TempDir(), "idem.db")
		clock := clocktest.New(time.Now().Truncate(time.Millisecond))
		s, err := storeurl.Open(context.Background(), url, &storeurl.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		// The bolt store itself: *storeurl.Opened passes on the Store
		// methods only, not the Stepper power.
		app, err := idem.New(s.Store, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		start := clock.Now()
		key := run(t, clock, app)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		check(t, &fixture{t: t, clock: clock, getenv: map[string]string{EnvStore: url}}, key, start)
	})
}

// show prints every value read from the store with its control
// characters escaped: a terminal error's message (text an operation chose,
// perhaps from a remote reply) cannot drive the operator's terminal.
func TestShowEscapesTheRecordsText(t *testing.T) {
	t.Parallel()
	f := setup(t)
	req := idem.Request{Operation: "checkout", Key: "order-escape"}
	_, err := idem.Do(context.Background(), f.app, req, func(context.Context) (string, error) {
		return "", idem.Terminal(errors.New("declined\x1b[2J\tnow\nfake: line"), "card\x07declined")
	})
	if !errors.Is(err, idem.ErrTerminal) {
		t.Fatalf("the operation: %v", err)
	}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	out := f.must("show", id.StoreKey.String())
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\nfake: line") {
		t.Fatalf("show printed the record's control characters:\n%q", out)
	}
	for _, want := range []string{`card\u0007declined`, `declined\u001b[2J\u0009now\u000afake: line`} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %s:\n%s", want, out)
		}
	}
}
