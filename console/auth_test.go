package console_test

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// signIn posts a sign-in from the client named by X-Forwarded-For (the
// console trusts the loopback proxy in these tests) and returns its
// status and headers.
func signIn(c *consoletest.Client, client, user, secret string) (int, http.Header) {
	h := http.Header{}
	if client != "" {
		h.Set("X-Forwarded-For", client)
	}
	code, _, hdr := c.PostWith("login", url.Values{"user": {user}, "secret": {secret}}, h)
	return code, hdr
}

func throttled(t *testing.T, cfg console.Config) (*fixture, *consoletest.Client) {
	cfg.Write = true
	cfg.Credentials = []console.Credential{{User: "ops", Secret: secret}, {Secret: "a-long-random-token"}}
	cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	f := setup(t, cfg)
	return f, consoletest.NewClient(t, f.srv.URL+"/")
}

// 100 wrong sign-ins from one client: the first SignInFailures are
// checked, then sign-in closes for a delay that doubles with each further
// failure, answered 429 with Retry-After without checking the password
// (the right one included); the burst is logged as a few summary lines.
func TestSignInIsThrottledPerClient(t *testing.T) {
	t.Parallel()
	f, c := throttled(t, console.Config{SignInFailures: 5, SignInWindow: time.Minute})
	counts := map[int]int{}
	for i := range 100 {
		code, h := signIn(c, "192.0.2.7", "ops", "wrong-guess-"+string(rune('a'+i%26)))
		counts[code]++
		if code == http.StatusTooManyRequests && h.Get("Retry-After") != "12" {
			t.Fatalf("attempt %d: Retry-After %q, want 12 (1m / 5)", i, h.Get("Retry-After"))
		}
	}
	if counts[http.StatusUnauthorized] != 6 || counts[http.StatusTooManyRequests] != 94 {
		t.Fatalf("100 wrong sign-ins: %v; want 6 checked (401) and 94 refused unchecked (429)", counts)
	}
	if code, _ := signIn(c, "192.0.2.7", "ops", secret); code != http.StatusTooManyRequests {
		t.Fatalf("the right password while closed: %d, want 429", code)
	}
	// After the delay one more guess is checked, and the next delay is
	// twice as long.
	f.clock.Advance(12 * time.Second)
	if code, _ := signIn(c, "192.0.2.7", "ops", "wrong-again"); code != http.StatusUnauthorized {
		t.Fatalf("after the delay: %d, want 401", code)
	}
	if code, h := signIn(c, "192.0.2.7", "ops", secret); code != http.StatusTooManyRequests || h.Get("Retry-After") != "24" {
		t.Fatalf("after a 7th failure: %d Retry-After %q, want 429 and 24", code, h.Get("Retry-After"))
	}
	// A client that tries again as soon as it may keeps doubling its
	// delay past the window (48s, 96s, 192s …), up to SignInMaxDelay.
	f.clock.Advance(24 * time.Second)
	for _, want := range []string{"48", "96", "192", "384", "768", "900", "900"} {
		if code, _ := signIn(c, "192.0.2.7", "ops", "wrong-again"); code != http.StatusUnauthorized {
			t.Fatalf("a guess after the delay: %d, want 401", code)
		}
		_, h := signIn(c, "192.0.2.7", "ops", secret)
		if got := h.Get("Retry-After"); got != want {
			t.Fatalf("Retry-After %s, want %s", got, want)
		}
		d, _ := time.ParseDuration(want + "s")
		f.clock.Advance(d)
	}
	// Another client with a token is not held up by the first one.
	if code, _ := signIn(c, "198.51.100.9", "", "a-long-random-token"); code != http.StatusSeeOther {
		t.Fatalf("another client's sign-in: %d", code)
	}
	if code, _ := signIn(c, "192.0.2.7", "ops", secret); code != http.StatusSeeOther {
		t.Fatalf("the right password after the delay: %d", code)
	}
	logs := f.logs.String()
	if n := strings.Count(logs, "sign-in refused") + strings.Count(logs, "sign-in throttled"); n > 10 {
		t.Fatalf("%d log lines for one burst of 101 failures; want a summary:\n%s", n, logs)
	}
	if !strings.Contains(logs, "sign-in throttled") || !strings.Contains(logs, "failures=6") || !strings.Contains(logs, "client=192.0.2.7") {
		t.Fatalf("no summary of the burst:\n%s", logs)
	}
	if !strings.Contains(logs, "refused=95") || !strings.Contains(logs, "failures_before=14") {
		t.Fatalf("the summary does not count the refused attempts, or the sign-in the failures before it:\n%s", logs)
	}
}

// Wrong passwords for one user from many clients close sign-in for that
// user, not for the others.
func TestSignInIsThrottledPerUser(t *testing.T) {
	t.Parallel()
	_, c := throttled(t, console.Config{SignInFailures: 3})
	for i := range 3 {
		if code, _ := signIn(c, "203.0.113."+string(rune('1'+i)), "ops", "wrong-password"); code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i, code)
		}
	}
	if code, _ := signIn(c, "203.0.113.50", "ops", "wrong-password"); code != http.StatusUnauthorized {
		t.Fatalf("4th failure: %d", code)
	}
	if code, h := signIn(c, "203.0.113.60", "ops", secret); code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("ops from a fresh client: %d %v, want 429: the user is throttled", code, h)
	}
	if code, _ := signIn(c, "203.0.113.61", "", "a-long-random-token"); code != http.StatusSeeOther {
		t.Fatalf("a token from a fresh client: %d: only ops is throttled", code)
	}
}

// No credential reaches a log line: not a wrong password, not a password
// typed into the user field, not a user name no credential has, not the
// right password.
func TestNoCredentialIsLogged(t *testing.T) {
	t.Parallel()
	f, c := throttled(t, console.Config{SignInFailures: 100})
	inputs := []string{"hunter2-typed-as-user", "wrong-password-xyz", "a-long-random-token-typo", "mallory"}
	signIn(c, "", inputs[0], secret)
	signIn(c, "", "ops", inputs[1])
	signIn(c, "", "", inputs[2])
	signIn(c, "", inputs[3], inputs[1])
	if code, _ := signIn(c, "", "ops", secret); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", code)
	}
	logs := f.logs.String()
	for _, s := range append(inputs, secret, "a-long-random-token") {
		if strings.Contains(logs, s) {
			t.Errorf("the log holds %q:\n%s", s, logs)
		}
	}
	if !strings.Contains(logs, `user=(unknown)`) || !strings.Contains(logs, "user=ops") {
		t.Fatalf("the log does not say who, as far as it may:\n%s", logs)
	}
}

// The session cookie is Secure when the console is told a TLS proxy
// serves it, or when a trusted proxy says so; an untrusted peer's
// X-Forwarded-Proto changes nothing.
func TestSecureCookiesBehindAProxy(t *testing.T) {
	t.Parallel()
	secure := func(cfg console.Config, h http.Header) bool {
		cfg.Credentials = []console.Credential{{User: "ops", Secret: secret}}
		f := setup(t, cfg)
		c := consoletest.NewClient(t, f.srv.URL+"/")
		code, _, hdr := c.PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, h)
		if code != http.StatusSeeOther {
			t.Fatalf("sign-in: %d", code)
		}
		return strings.Contains(hdr.Get("Set-Cookie"), "; Secure")
	}
	https := http.Header{"X-Forwarded-Proto": {"https"}}
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	if secure(console.Config{}, nil) {
		t.Error("Secure over plain HTTP with no proxy")
	}
	if !secure(console.Config{SecureCookies: true}, nil) {
		t.Error("not Secure with SecureCookies")
	}
	if !secure(console.Config{TrustedProxies: loopback}, https) {
		t.Error("not Secure behind a trusted proxy saying https")
	}
	if secure(console.Config{}, https) {
		t.Error("Secure on an untrusted peer's X-Forwarded-Proto")
	}
}

// Cross-origin POSTs are refused by http.CrossOriginProtection: a form
// of another site cannot sign in (login CSRF) nor act, even with the
// session's cookie and token; a same-origin one is served.
func TestCrossOriginPostsAreRefused(t *testing.T) {
	t.Parallel()
	f, c := writable(t)
	cross := http.Header{"Sec-Fetch-Site": {"cross-site"}}
	if code, body, _ := c.PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, cross); code != http.StatusForbidden || !strings.Contains(body, "Cross-origin") {
		t.Fatalf("cross-site sign-in: %d\n%s", code, body)
	}
	_, body, _ := c.Get(rec(f.keys.Stuck))
	form := consoletest.Hidden(body, "action", "release")
	if code, _, _ := c.PostWith("confirm", form, http.Header{"Origin": {"https://evil.example"}}); code != http.StatusForbidden {
		t.Fatalf("confirm from another origin: %d", code)
	}
	if code, _, _ := c.PostWith("confirm", form, http.Header{"Sec-Fetch-Site": {"same-origin"}}); code != http.StatusOK {
		t.Fatalf("same-origin confirm: %d", code)
	}
	trusted := setup(t, console.Config{Credentials: []console.Credential{{User: "ops", Secret: secret}}, TrustedOrigins: []string{"https://ops.example.com"}})
	tc := consoletest.NewClient(t, trusted.srv.URL+"/")
	if code, _, _ := tc.PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, http.Header{"Origin": {"https://ops.example.com"}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in from a trusted origin: %d", code)
	}
}
