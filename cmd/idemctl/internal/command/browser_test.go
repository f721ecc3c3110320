package command

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// EnvScreenshots names a directory the browser tests write their
// screenshots to (docs/img when the docs' images are refreshed).
const EnvScreenshots = "IDEM_CONSOLE_SCREENSHOTS"

// browser starts headless Chromium (Debian's chromium package) for the
// test: missing, it skips the test, and fails it when CI is set.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("IDEM_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		testenv.Missing(t, "no Chromium: install Debian's chromium package (apt-get install chromium) or set IDEM_CHROMIUM")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 860), chromedp.Flag("disable-gpu", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// do runs steps in the browser, each wait bounded.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// navigate runs steps that load a page (a click on a link or a button),
// waits for it, and returns its HTTP status.
func navigate(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, steps...)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

// get runs an action that returns a value.
func get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// screenshot saves the page as name.png in $IDEM_CONSOLE_SCREENSHOTS,
// from the memory store's run.
func (f *fixture) screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" || !f.screenshots {
		return
	}
	png := get(t, ctx, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// text is the visible text of the page's main element.
func text(t *testing.T, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, chromedp.Text(chromedp.CSS("main")))
}

// button is the submit button of the form whose hidden action is action.
func button(action string) chromedp.Search {
	return chromedp.Search(fmt.Sprintf(`//form[.//input[@name="action" and @value=%q]]//button[@type="submit"]`, action))
}

// css is a CSS selector.
type css = chromedp.CSS

// The acceptance path, in a real browser: sign in, filter to the
// stuck records, open one, resolve it with a result, see it COMPLETED,
// and check through the library that a retry replays the result; a write
// without a session and one without the CSRF token are refused; a record
// whose result holds a script renders it inert.
func TestBrowserResolveStuckRecord(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		f := setup(t)
		f.getenv[EnvStore] = "memory:" // shown in the header of the docs' screenshots
		f.screenshots = true
		browserScenario(t, f)
	})
	t.Run("redis", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		f := setup(t)
		f.store = nil
		f.getenv[EnvStore] = fmt.Sprintf("redis://%s/0?prefix=browser%d:", addr, time.Now().UnixNano())
		browserScenario(t, f)
	})
}

func browserScenario(t *testing.T, f *fixture) {
	ctx := browser(t)
	keys := f.seed()
	f.getenv[EnvConsoleAuth] = "ops:" + consoleSecret
	base := f.serving("-write")
	signIn := func() {
		do(t, ctx, chromedp.Navigate(base), chromedp.WaitVisible(css("#secret")),
			chromedp.SendKeys(css("#user"), "ops"), chromedp.SendKeys(css("#secret"), consoleSecret))
		if code := navigate(t, ctx, chromedp.Submit(css("#secret"))); code != 200 {
			t.Fatalf("sign-in: %d", code)
		}
		do(t, ctx, chromedp.WaitVisible(css(".cards")))
	}
	signIn()
	if s := text(t, ctx); !strings.Contains(s, "Stuck") || !strings.Contains(s, "refund") {
		t.Fatalf("overview:\n%s", s)
	}
	f.screenshot(t, ctx, "console-overview")

	// Every record, then only the stuck ones, through the filter form.
	do(t, ctx, chromedp.Navigate(base+"records"), chromedp.WaitVisible(css("table.records")))
	f.screenshot(t, ctx, "console-list")
	do(t, ctx, chromedp.Click(css(`input[name="stuck"]`)))
	navigate(t, ctx, chromedp.Click(css(`form.filters button`)))
	rows := get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("table.records tbody tr").length`))
	if s := text(t, ctx); rows != 1 || !strings.Contains(s, keys.Stuck.String()) {
		t.Fatalf("stuck filter: %d rows\n%s", rows, s)
	}

	// Open it and resolve it.
	navigate(t, ctx, chromedp.Click(css(`td.key a`)))
	if s := text(t, ctx); !strings.Contains(s, "stuck: past its expected completion") || !strings.Contains(s, "arn:aws:states:eu-west-1") {
		t.Fatalf("record:\n%s", s)
	}
	f.screenshot(t, ctx, "console-record")
	do(t, ctx, chromedp.SendKeys(css("#result"), `{"charge":"ch_1003","settled_by":"console"}`))
	navigate(t, ctx, chromedp.Click(button("complete")))
	if s := text(t, ctx); !strings.Contains(s, "becomes COMPLETED") || !strings.Contains(s, "IN_PROGRESS (fence 1") {
		t.Fatalf("confirmation:\n%s", s)
	}
	f.screenshot(t, ctx, "console-confirm")
	navigate(t, ctx, chromedp.Click(css(`button.primary`)))
	if s := text(t, ctx); !strings.Contains(s, "Resolved as COMPLETED") || !strings.Contains(s, "ch_1003") {
		t.Fatalf("after resolve:\n%s", s)
	}

	// Through the library, a retry replays the resolved result.
	replay := func() idem.Result[map[string]string] {
		s := f.store
		if s == nil {
			opened, err := storeurl.Open(context.Background(), f.getenv[EnvStore], &storeurl.Options{Passive: true, Clock: f.clock})
			if err != nil {
				t.Fatal(err)
			}
			defer opened.Close()
			s = opened.Store
		}
		app, err := idem.New(s, &idem.Config{Clock: f.clock, Owner: "worker-8", Expiry: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		res, err := idem.Do(context.Background(), app, idem.Request{Operation: "charge", Tenant: "acme", Key: "order-1003"},
			func(context.Context) (map[string]string, error) { return nil, errors.New("the operation ran again") })
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := replay(); !res.Replayed || res.Value["charge"] != "ch_1003" {
		t.Fatalf("retry after resolve: %+v", res)
	}

	// A POST without the CSRF token is refused.
	failed := base + "record?" + url.Values{"key": {keys.Failed.String()}}.Encode()
	do(t, ctx, chromedp.Navigate(failed), chromedp.WaitVisible(button("release")))
	get(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll('input[name="csrf"]').forEach(e => e.remove()); 0`))
	if code := navigate(t, ctx, chromedp.Click(button("release"))); code != 403 {
		t.Errorf("POST without CSRF: %d", code)
	}
	if s := text(t, ctx); !strings.Contains(s, "403") || !strings.Contains(s, "CSRF") {
		t.Fatalf("POST without CSRF:\n%s", s)
	}
	// A write without credentials (the session cookie gone) is refused.
	do(t, ctx, chromedp.Navigate(failed), chromedp.WaitVisible(button("release")))
	get(t, ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{})
		return err
	}))
	if code := navigate(t, ctx, chromedp.Click(button("release"))); code != 401 {
		t.Errorf("POST without a session: %d", code)
	}
	if s := text(t, ctx); !strings.Contains(s, "401") || !strings.Contains(s, "Sign in first") {
		t.Fatalf("POST without a session:\n%s", s)
	}
	if st := f.seedState(keys.Failed); st == nil || st.Status != idem.StatusFailed {
		t.Fatalf("a refused write changed the FAILED record: %+v", st)
	}

	// The script record renders inert: no script or image element, the
	// page title untouched, the markup shown as text.
	signIn()
	do(t, ctx, chromedp.Navigate(base+"record?"+url.Values{"key": {keys.Script.String()}}.Encode()), chromedp.WaitVisible(css("pre.body")))
	scripts := get(t, ctx, chromedp.Evaluate[int](`document.scripts.length`))
	images := get(t, ctx, chromedp.Evaluate[int](`document.images.length`))
	title := get(t, ctx, chromedp.Title())
	if s := text(t, ctx); scripts != 0 || images != 0 || title == "pwned" || !strings.Contains(s, "<script>document.title='pwned'</script>") {
		t.Fatalf("script record: %d scripts, %d images, title %q\n%s", scripts, images, title, s)
	}

	// Readable on a phone-sized window: nothing wider than the screen but
	// the tables' own scrolling boxes.
	do(t, ctx, chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"records"), chromedp.WaitVisible(css("table.records")))
	if get(t, ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)) {
		t.Error("the records page is wider than a phone's window")
	}
}

// seedState reads key's record through a fresh engine on the fixture's
// store (or its URL), nil when absent.
func (f *fixture) seedState(k idem.StoreKey) *idem.State {
	f.t.Helper()
	s := f.store
	if s == nil {
		opened, err := storeurl.Open(context.Background(), f.getenv[EnvStore], &storeurl.Options{Passive: true, Clock: f.clock})
		if err != nil {
			f.t.Fatal(err)
		}
		defer opened.Close()
		s = opened.Store
	}
	e, err := idem.New(s, &idem.Config{Clock: f.clock})
	if err != nil {
		f.t.Fatal(err)
	}
	st, err := e.Status(context.Background(), k)
	if err != nil {
		return nil
	}
	return st
}
