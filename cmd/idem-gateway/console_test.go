package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

func TestConsoleFlagErrors(t *testing.T) {
	auth := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(auth, []byte("ops:short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		"-upstream http://x -console":                                                "-console needs -admin",
		"-upstream http://x -console-write":                                          "need -console",
		"-upstream http://x -admin :0 -console -console-write":                       "-console-write needs credentials",
		"-upstream http://x -admin :0 -console -console-auth-file " + auth:           "at least 12",
		"-upstream http://x -admin :0 -console -console-auth-file /nope":             "-console-auth-file",
		"-upstream http://x -admin :0 -console -console-trusted-proxies 10.0.0.0/33": "-console-trusted-proxies",
		"-upstream http://x -admin :0 -console -console-sign-in-failures 0":          "-console-sign-in-failures",
	} {
		t.Setenv(envConsoleAuth, "")
		_, err := parseFlags(strings.Fields(args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}

// Behind a TLS-terminating proxy the console's session cookie is Secure:
// with -console-secure-cookies, and with -console-trusted-proxies when
// the proxy says X-Forwarded-Proto: https; a cross-origin sign-in is
// refused.
func TestConsoleCookiesBehindAProxy(t *testing.T) {
	const secret = "correct-horse-battery"
	auth := filepath.Join(t.TempDir(), "console-auth")
	if err := os.WriteFile(auth, []byte("ops:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	signIn := func(gw *proc, h http.Header) (int, string) {
		c := consoletest.NewClient(t, "http://"+gw.admin+consolePath)
		code, _, hdr := c.PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, h)
		return code, hdr.Get("Set-Cookie")
	}
	for _, tc := range []struct {
		flags  []string
		header http.Header
		secure bool
	}{
		{flags: nil, header: http.Header{"X-Forwarded-Proto": {"https"}}, secure: false},
		{flags: []string{"-console-secure-cookies"}, secure: true},
		{flags: []string{"-console-trusted-proxies", "127.0.0.1"}, header: http.Header{"X-Forwarded-Proto": {"https"}}, secure: true},
	} {
		args := append([]string{"-upstream", up.srv.URL, "-store", "bolt://" + filepath.Join(t.TempDir(), "gw.db"), "-admin", "127.0.0.1:0",
			"-console", "-console-auth-file", auth}, tc.flags...)
		gw := startGateway(t, args...)
		code, cookie := signIn(gw, tc.header)
		if code != http.StatusSeeOther || strings.Contains(cookie, "; Secure") != tc.secure {
			t.Errorf("%v: %d %q, want Secure %v", tc.flags, code, cookie, tc.secure)
		}
		if code, _ := signIn(gw, http.Header{"Sec-Fetch-Site": {"cross-site"}}); code != http.StatusForbidden {
			t.Errorf("%v: cross-site sign-in: %d, want 403", tc.flags, code)
		}
		gw.kill()
	}
}

// The gateway's console over its own bolt file, which no other process
// can open while the gateway runs, in a real browser: the seeded stuck
// record is found, resolved with a result and shown COMPLETED; after the
// gateway stops, a retry through the library replays the result.
func TestConsoleOnBoltInBrowser(t *testing.T) {
	chromium := os.Getenv("IDEM_CHROMIUM")
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if chromium != "" {
			break
		}
		chromium, _ = exec.LookPath(name)
	}
	if chromium == "" {
		testenv.Missing(t, "no Chromium: install Debian's chromium package (apt-get install chromium) or set IDEM_CHROMIUM")
	}
	const secret = "correct-horse-battery"
	db := "bolt://" + filepath.Join(t.TempDir(), "gw.db")
	// Seed the file before the gateway holds it, on a clock ten minutes
	// back: the claim with a minute's lease is stuck now, and records last
	// a day.
	clock := clocktest.New(time.Now().Add(-10 * time.Minute))
	ctx := context.Background()
	s, err := storeurl.Open(ctx, db, &storeurl.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	app, err := idem.New(s.Store, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := idem.New(s.Store, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keys := consoletest.Seed(t, app, raw, clock.Advance)
	s.Close()

	auth := filepath.Join(t.TempDir(), "console-auth")
	if err := os.WriteFile(auth, []byte("ops:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", db, "-admin", "127.0.0.1:0",
		"-console", "-console-write", "-console-auth-file", auth)
	if a := send("POST", gw.url("/orders"), `{"item":"book"}`, "Idempotency-Key", "order-9"); a.status != 201 {
		t.Fatalf("a request through the gateway: %+v", a)
	}
	base := "http://" + gw.admin + consolePath

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", chromium, err)
	}
	step := func(load bool, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		var err error
		if load {
			_, err = chromedp.RunResponse(sctx, steps...)
		} else {
			err = chromedp.Do(sctx, steps...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	text := func() string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS("main")))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	step(false, chromedp.Navigate(base), chromedp.WaitVisible(css("#secret")),
		chromedp.SendKeys(css("#user"), "ops"), chromedp.SendKeys(css("#secret"), secret))
	step(true, chromedp.Submit(css("#secret")))
	if s := text(); !strings.Contains(s, "charge") || !strings.Contains(s, "refund") {
		t.Fatalf("overview:\n%s", s)
	}
	step(true, chromedp.Navigate(base+"records?stuck=1"))
	if s := text(); !strings.Contains(s, keys.Stuck.String()) || strings.Contains(s, keys.Fresh.String()) {
		t.Fatalf("stuck records:\n%s", s)
	}
	step(true, chromedp.Click(css("td.key a")))
	step(false, chromedp.SendKeys(css("#result"), `{"charge":"ch_gw"}`))
	step(true, chromedp.Click(chromedp.Search(`//form[.//input[@name="action" and @value="complete"]]//button[@type="submit"]`)))
	if s := text(); !strings.Contains(s, "becomes COMPLETED") {
		t.Fatalf("confirmation:\n%s", s)
	}
	step(true, chromedp.Click(css("button.primary")))
	if s := text(); !strings.Contains(s, "Resolved as COMPLETED") || !strings.Contains(s, "ch_gw") {
		t.Fatalf("after resolve:\n%s", s)
	}
	// The gateway's own record shows its stored response.
	step(true, chromedp.Navigate(base+"records?"+url.Values{"scope": {scope}}.Encode()))
	step(true, chromedp.Click(css("td.key a")))
	if s := text(); !strings.Contains(s, "COMPLETED") || !strings.Contains(s, "HTTP 201 Created") || !strings.Contains(s, `"key": "order-9"`) {
		t.Fatalf("the gateway's record:\n%s", s)
	}

	gw.kill()
	s, err = storeurl.Open(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	app, err = idem.New(s.Store, &idem.Config{Owner: "worker-8", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	res, err := idem.Do(ctx, app, idem.Request{Operation: "charge", Tenant: "acme", Key: "order-1003"},
		func(context.Context) (map[string]string, error) { return nil, errors.New("the operation ran again") })
	if err != nil || !res.Replayed || res.Value["charge"] != "ch_gw" {
		t.Fatalf("retry after resolve: %+v %v", res, err)
	}
}
