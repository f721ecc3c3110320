// Package consoletest seeds a store with the records the operator
// console's tests look at, and drives the console over HTTP. Test-only.
package consoletest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
)

// Script is the result the script record holds: markup a console must
// render inert.
const Script = `{"note":"<script>document.title='pwned'</script><img src=x onerror=alert(1)>"}`

// Keys are the seeded records.
type Keys struct {
	Completed, Failed, Stuck, Fresh, Script, Binary idem.StoreKey
}

// Seed writes, through e (an application engine on the test's clock), a
// COMPLETED record, a FAILED one, one stuck IN_PROGRESS (past its expected
// completion, with a Step Functions ARN attached), a fresh IN_PROGRESS
// one, a COMPLETED one whose result holds a script, and a COMPLETED one
// with a binary result, both written through raw (an engine with
// the default JSONCodec, which stores []byte as it is, on the same store; nil writes it through e, as JSON).
// advance moves the clock on by more than a minute between the stuck
// claim and the fresh one.
func Seed(t testing.TB, e, raw *idem.Engine, advance func(time.Duration)) Keys {
	t.Helper()
	ctx := context.Background()
	var k Keys
	done := func(op, tenant, key string, v any, eng *idem.Engine) idem.StoreKey {
		res, err := idem.Do(ctx, eng, idem.Request{Operation: op, Tenant: tenant, Key: key}, func(context.Context) (any, error) { return v, nil })
		if err != nil {
			t.Fatalf("seeding %s %s: %v", op, key, err)
		}
		sk, err := idem.ParseStoreKey(res.StoreKey)
		if err != nil {
			t.Fatal(err)
		}
		return sk
	}
	k.Completed = done("charge", "acme", "order-1001", map[string]any{"charge": "ch_1001", "amount": 1200, "currency": "EUR"}, e)
	bin := make([]byte, 300)
	for i := range bin {
		bin[i] = byte(i)
	}
	if raw != nil {
		k.Script = done("charge", "<script>alert(1)</script>", "order-1002", []byte(Script), raw)
		k.Binary = done("export", "", "blob-1", bin, raw)
	} else { // the default codec escapes < and > in JSON
		k.Script = done("charge", "<script>alert(1)</script>", "order-1002", rawJSON(Script), e)
		k.Binary = done("export", "", "blob-1", bin, e)
	}
	begin := func(op, key string, d time.Duration) idem.Token {
		b, err := e.Begin(ctx, idem.Request{Operation: op, Tenant: "acme", Key: key}, &idem.BeginOptions{ExpectedCompletion: d})
		if err != nil || !b.Acquired {
			t.Fatalf("seeding %s %s: %+v %v", op, key, b, err)
		}
		return b.Token
	}
	failed := begin("refund", "refund-77", time.Minute)
	if err := e.Fail(ctx, failed, &idem.TerminalError{Code: "declined", Message: "card declined by issuer"}); err != nil {
		t.Fatal(err)
	}
	k.Failed = failed.Key
	stuck := begin("charge", "order-1003", time.Minute)
	if err := e.Attach(ctx, stuck, "arn:aws:states:eu-west-1:123456789012:execution:charge-card:order-1003"); err != nil {
		t.Fatal(err)
	}
	k.Stuck = stuck.Key
	advance(2 * time.Minute)
	k.Fresh = begin("charge", "order-1004", time.Hour).Key
	return k
}

// rawJSON is a JSON value the default codec writes as it is.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// Client drives a console over HTTP, keeping its cookies.
type Client struct {
	T    testing.TB
	Base string // the console's URL, with the trailing slash
	HTTP *http.Client
}

// NewClient returns a client of the console at base.
func NewClient(t testing.TB, base string) *Client {
	jar, _ := cookiejar.New(nil)
	return &Client{T: t, Base: base, HTTP: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Get fetches path (relative to the base) and returns its status and body.
func (c *Client) Get(path string) (int, string, http.Header) {
	c.T.Helper()
	resp, err := c.HTTP.Get(c.Base + path)
	if err != nil {
		c.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// Post posts form to path and returns its status, body and Location.
func (c *Client) Post(path string, form url.Values) (int, string, string) {
	c.T.Helper()
	resp, err := c.HTTP.PostForm(c.Base+path, form)
	if err != nil {
		c.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Location")
}

// PostWith posts form to path with the headers h and returns its status,
// body and response headers.
func (c *Client) PostWith(path string, form url.Values, h http.Header) (int, string, http.Header) {
	c.T.Helper()
	req, err := http.NewRequest(http.MethodPost, c.Base+path, strings.NewReader(form.Encode()))
	if err != nil {
		c.T.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		c.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

var hiddenInput = regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`)

// Hidden returns the hidden fields of the first form in body with name
// set to value, or of the first form when name is "".
func Hidden(body, name, value string) url.Values {
	forms := strings.Split(body, "<form")
	for _, f := range forms[1:] {
		f, _, _ = strings.Cut(f, "</form>")
		v := url.Values{}
		for _, m := range hiddenInput.FindAllStringSubmatch(f, -1) {
			v.Add(m[1], unescape(m[2]))
		}
		if name == "" || v.Get(name) == value {
			return v
		}
	}
	return nil
}

func unescape(s string) string {
	r := strings.NewReplacer("&amp;", "&", "&lt;", "<", "&gt;", ">", "&#34;", `"`, "&#39;", "'", "&quot;", `"`, "&#43;", "+")
	return r.Replace(s)
}

// SignIn signs in with user and secret; it fails the test unless the
// console accepts them.
func (c *Client) SignIn(user, secret string) {
	c.T.Helper()
	if err := c.TrySignIn(user, secret); err != nil {
		c.T.Fatal(err)
	}
}

// TrySignIn signs in, returning why it failed.
func (c *Client) TrySignIn(user, secret string) error {
	code, body, _ := c.Get("login")
	if code != http.StatusOK {
		return fmt.Errorf("GET login: %d", code)
	}
	f := Hidden(body, "", "")
	f.Set("user", user)
	f.Set("secret", secret)
	code, _, loc := c.Post("login", f)
	if code != http.StatusSeeOther || strings.HasSuffix(loc, "login") {
		return fmt.Errorf("sign-in refused: %d %s", code, loc)
	}
	return nil
}

// Act opens key's record, posts the action form named action (with
// fields added) to confirm, then confirms; it returns the final status
// and Location (or body, on an error page).
func (c *Client) Act(key idem.StoreKey, action string, fields url.Values) (int, string) {
	c.T.Helper()
	code, body, _ := c.Get("record?" + url.Values{"key": {key.String()}}.Encode())
	if code != http.StatusOK {
		c.T.Fatalf("record %s: %d", key, code)
	}
	f := Hidden(body, "action", action)
	if f == nil {
		c.T.Fatalf("record %s has no %s form", key, action)
	}
	for k, v := range fields {
		f[k] = v
	}
	code, body, _ = c.Post("confirm", f)
	if code != http.StatusOK {
		return code, body
	}
	code, body, loc := c.Post("act", Hidden(body, "action", action))
	if loc != "" {
		return code, loc
	}
	return code, body
}
