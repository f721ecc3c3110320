package command

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
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
