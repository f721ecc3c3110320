package console_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// signIn posts a sign-in from the client named by X-Forwarded-For (the
// console trusts the loopback proxy in these tests) and returns its
// status and headers; see signInHeld.
func (f *fixture) signIn(c *consoletest.Client, client, user, secret string) (int, http.Header) {
	f.t.Helper()
	code, h, _ := f.signInHeld(c, client, user, secret)
	return code, h
}

// signInHeld posts a sign-in as signIn does. A sign-in the console holds
// (SignInUserDelay) is let through by moving the clock on by the hold,
// and held says so; an empty client sends no X-Forwarded-For.
func (f *fixture) signInHeld(c *consoletest.Client, client, user, secret string) (code int, h http.Header, held bool) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.Base+"login", strings.NewReader(url.Values{"user": {user}, "secret": {secret}}.Encode()))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if client != "" {
		req.Header.Set("X-Forwarded-For", client)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := c.HTTP.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- answer{resp, err}
	}()
	for {
		select {
		case a := <-done:
			if a.err != nil {
				f.t.Fatal(a.err)
			}
			return a.resp.StatusCode, a.resp.Header, held
		default:
		}
		if !held && console.HeldSignIns(f.console) > 0 {
			f.clock.Advance(f.hold)
			held = true
			continue
		}
		time.Sleep(50 * time.Microsecond) // the request is on its way: no time passes on the console's clock
	}
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
		code, h := f.signIn(c, "192.0.2.7", "ops", "wrong-guess-"+string(rune('a'+i%26)))
		counts[code]++
		if code == http.StatusTooManyRequests && h.Get("Retry-After") != "12" {
			t.Fatalf("attempt %d: Retry-After %q, want 12 (1m / 5)", i, h.Get("Retry-After"))
		}
	}
	if counts[http.StatusUnauthorized] != 6 || counts[http.StatusTooManyRequests] != 94 {
		t.Fatalf("100 wrong sign-ins: %v; want 6 checked (401) and 94 refused unchecked (429)", counts)
	}
	if code, _ := f.signIn(c, "192.0.2.7", "ops", secret); code != http.StatusTooManyRequests {
		t.Fatalf("the right password while closed: %d, want 429", code)
	}
	// After the delay one more guess is checked, and the next delay is
	// twice as long.
	f.clock.Advance(12 * time.Second)
	if code, _ := f.signIn(c, "192.0.2.7", "ops", "wrong-again"); code != http.StatusUnauthorized {
		t.Fatalf("after the delay: %d, want 401", code)
	}
	if code, h := f.signIn(c, "192.0.2.7", "ops", secret); code != http.StatusTooManyRequests || h.Get("Retry-After") != "24" {
		t.Fatalf("after a 7th failure: %d Retry-After %q, want 429 and 24", code, h.Get("Retry-After"))
	}
	// A client that tries again as soon as it may keeps doubling its
	// delay past the window (48s, 96s, 192s …), up to SignInMaxDelay.
	f.clock.Advance(24 * time.Second)
	for _, want := range []string{"48", "96", "192", "384", "768", "900", "900"} {
		if code, _ := f.signIn(c, "192.0.2.7", "ops", "wrong-again"); code != http.StatusUnauthorized {
			t.Fatalf("a guess after the delay: %d, want 401", code)
		}
		_, h := f.signIn(c, "192.0.2.7", "ops", secret)
		if got := h.Get("Retry-After"); got != want {
			t.Fatalf("Retry-After %s, want %s", got, want)
		}
		d, _ := time.ParseDuration(want + "s")
		f.clock.Advance(d)
	}
	// Another client with a token is not held up by the first one.
	if code, _ := f.signIn(c, "198.51.100.9", "", "a-long-random-token"); code != http.StatusSeeOther {
		t.Fatalf("another client's sign-in: %d", code)
	}
	if code, _ := f.signIn(c, "192.0.2.7", "ops", secret); code != http.StatusSeeOther {
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

// Wrong passwords for one user from many clients never close sign-in to
// a client that has not failed: once they pass the limit, every sign-in
// as that user, from any client and whatever it carries, is held
// SignInUserDelay before it is checked, and then answered as always.
// Other users are not held.
func TestSignInOfAUserIsSlowedNeverRefused(t *testing.T) {
	t.Parallel()
	f, c := throttled(t, console.Config{SignInFailures: 3, SignInUserDelay: 2 * time.Second})
	for i := range 4 {
		if code, _, held := f.signInHeld(c, "203.0.113."+string(rune('1'+i)), "ops", "wrong-password"); code != http.StatusUnauthorized || held {
			t.Fatalf("failure %d from a client of its own: %d, held %v; want 401 at once", i, code, held)
		}
	}
	// Four failures of ops, from four clients: each client is below its
	// limit, the user is past it.
	for _, try := range []struct {
		client, secret string
		want           int
	}{
		{"203.0.113.60", secret, http.StatusSeeOther},
		{"203.0.113.61", "wrong-password", http.StatusUnauthorized},
		{"203.0.113.62", secret, http.StatusSeeOther},
	} {
		at := f.clock.Now()
		code, h, held := f.signInHeld(consoletest.NewClient(t, c.Base), try.client, "ops", try.secret)
		if code != try.want || !held || h.Get("Retry-After") != "" {
			t.Fatalf("ops from %s: %d, held %v, Retry-After %q; want %d after a hold, never 429", try.client, code, held, h.Get("Retry-After"), try.want)
		}
		if waited := f.clock.Now().Sub(at); waited != 2*time.Second {
			t.Fatalf("held for %v, want SignInUserDelay (2s)", waited)
		}
	}
	if code, _, held := f.signInHeld(c, "203.0.113.70", "", "a-long-random-token"); code != http.StatusSeeOther || held {
		t.Fatalf("a token from a fresh client: %d, held %v: only ops is slowed", code, held)
	}
	// A window without a failure of ops ends the slowdown.
	f.clock.Advance(time.Minute)
	if code, _, held := f.signInHeld(consoletest.NewClient(t, c.Base), "203.0.113.80", "ops", secret); code != http.StatusSeeOther || held {
		t.Fatalf("ops a window later: %d, held %v; want 303 at once", code, held)
	}
	if logs := f.logs.String(); !strings.Contains(logs, "sign-in slowed for a user") || !strings.Contains(logs, "held_for=2s") {
		t.Fatalf("the slowdown is not logged:\n%s", logs)
	}
}

// fromAddr is a client of f's console whose connections come from the
// loopback address src: to the console, another client than one from
// another address.
func fromAddr(t *testing.T, f *fixture, src string) *consoletest.Client {
	c := consoletest.NewClient(t, f.srv.URL+"/")
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	tr := &http.Transport{DialContext: d.DialContext}
	c.HTTP.Transport = tr
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// A guesser hammering an operator's user from one address closes sign-in
// to that address alone: the operator, from another, signs in with the
// right password, held no longer than SignInUserDelay, while the attack
// goes on and however long it has gone on. Over real connections from
// 127.0.0.1 and 127.0.0.2, no proxy in front.
func TestAGuesserCannotLockAnOperatorOut(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{Write: true, SignInFailures: 5, SignInWindow: time.Minute,
		Credentials: []console.Credential{{User: "ops", Secret: secret}}})
	attacker := fromAddr(t, f, "127.0.0.1")
	counts := map[int]int{}
	for i := range 2000 {
		code, _, _ := f.signInHeld(attacker, "", "ops", fmt.Sprintf("guess-%d", i))
		counts[code]++
	}
	if counts[http.StatusUnauthorized] != 6 || counts[http.StatusTooManyRequests] != 1994 {
		t.Fatalf("2000 guesses from one address: %v; want 6 checked (401), then 429", counts)
	}
	if code, _ := f.signIn(attacker, "", "ops", secret); code != http.StatusTooManyRequests {
		t.Fatalf("the right password from the guessing address: %d, want 429", code)
	}
	signIn := func(when string) {
		t.Helper()
		operator := fromAddr(t, f, "127.0.0.2")
		at := f.clock.Now()
		code, _, _ := f.signInHeld(operator, "", "ops", secret)
		if code != http.StatusSeeOther {
			t.Fatalf("%s: the operator's right password from 127.0.0.2: %d, want 303", when, code)
		}
		if waited := f.clock.Now().Sub(at); waited > f.hold {
			t.Fatalf("%s: the operator waited %v, more than SignInUserDelay %v", when, waited, f.hold)
		}
		if code, body, _ := operator.Get(""); code != http.StatusOK || !strings.Contains(body, "Overview") {
			t.Fatalf("%s: the operator's session: %d", when, code)
		}
	}
	signIn("during the attack")
	// An hour on, the guesser having tried again whenever it was let.
	for end := f.clock.Now().Add(time.Hour); ; {
		code, h := f.signIn(attacker, "", "ops", "guess-again")
		if code == http.StatusTooManyRequests {
			secs, _ := strconv.Atoi(h.Get("Retry-After"))
			f.clock.Advance(time.Duration(secs) * time.Second)
		} else if !f.clock.Now().Before(end) {
			break // just failed: its address is closed again
		}
	}
	signIn("an hour into the attack")
	if code, _ := f.signIn(attacker, "", "ops", secret); code != http.StatusTooManyRequests {
		t.Fatalf("the guessing address an hour on: %d, want 429", code)
	}
}

// No credential reaches a log line: not a wrong password, not a password
// typed into the user field, not a user name no credential has, not the
// right password.
func TestNoCredentialIsLogged(t *testing.T) {
	t.Parallel()
	f, c := throttled(t, console.Config{SignInFailures: 100})
	inputs := []string{"hunter2-typed-as-user", "wrong-password-xyz", "a-long-random-token-typo", "mallory"}
	f.signIn(c, "", inputs[0], secret)
	f.signIn(c, "", "ops", inputs[1])
	f.signIn(c, "", "", inputs[2])
	f.signIn(c, "", inputs[3], inputs[1])
	if code, _ := f.signIn(c, "", "ops", secret); code != http.StatusSeeOther {
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
