package command

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

const consoleSecret = "correct-horse-battery"

// serving runs idemctl serve with args until the test ends and returns
// the console's URL.
func (f *fixture) serving(args ...string) string {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	var out, errb syncBuffer
	env := f.env(&out, &errb)
	env.Listen = func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err == nil {
			addrc <- ln.Addr().String()
		}
		return ln, err
	}
	done := make(chan int, 1)
	go func() { done <- Run(ctx, append([]string{"serve", "-listen", "127.0.0.1:0"}, args...), env) }()
	select {
	case addr := <-addrc:
		f.t.Cleanup(func() {
			cancel()
			if code := <-done; code != ExitOK {
				f.t.Errorf("serve exited %d: %s", code, errb.String())
			}
		})
		return "http://" + addr + "/"
	case code := <-done:
		cancel()
		f.t.Fatalf("serve exited %d before listening: %s", code, errb.String())
	}
	return ""
}

// seedFixture seeds f's store (the fixture's own, or the one its URL
// names, opened and closed again, as the bolt file is single-process).
func (f *fixture) seed() consoletest.Keys {
	f.t.Helper()
	s, closeStore := f.store, func() error { return nil }
	if s == nil {
		opened, err := storeurl.Open(context.Background(), f.getenv[EnvStore], &storeurl.Options{Clock: f.clock})
		if err != nil {
			f.t.Fatal(err)
		}
		s, closeStore = opened.Store, opened.Close
	}
	defer closeStore()
	app, err := idem.New(s, &idem.Config{Clock: f.clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	raw, err := idem.New(s, &idem.Config{Clock: f.clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		f.t.Fatal(err)
	}
	return consoletest.Seed(f.t, app, raw, f.clock.Advance)
}

// onStores runs scenario on every store: the fixture's memstore, a bolt
// file, Redis, PostgreSQL and DynamoDB Local.
func onStores(t *testing.T, scenario func(t *testing.T, f *fixture)) {
	onStoresWith(t, nil, scenario)
}

// onStoresWith runs scenario on every store with idemctl on local
// (fixture.local), when it is not nil.
func onStoresWith(t *testing.T, local store.Clock, scenario func(t *testing.T, f *fixture)) {
	real := func(t *testing.T, u string) *fixture {
		f := &fixture{t: t, clock: clocktest.New(time.Now().Truncate(time.Millisecond)), local: local, getenv: map[string]string{EnvStore: u}}
		k, err := storeurl.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		switch k.Kind {
		case storeurl.Postgres:
			f.must("migrate")
		case storeurl.DynamoDB:
			f.must("create-table")
		}
		return f
	}
	t.Run("memory", func(t *testing.T) {
		f := setup(t)
		f.local = local
		scenario(t, f)
	})
	t.Run("bolt", func(t *testing.T) {
		scenario(t, real(t, "bolt://"+filepath.Join(t.TempDir(), "idem.db")))
	})
	t.Run("redis", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		scenario(t, real(t, fmt.Sprintf("redis://%s/0?prefix=console%d:", addr, time.Now().UnixNano())))
	})
	t.Run("postgres", func(t *testing.T) {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		user := os.Getenv("IDEM_PG_USER")
		if user == "" {
			user = "postgres"
		}
		scenario(t, real(t, fmt.Sprintf("postgres://%s@%s/test?table=console_%d", user, addr, time.Now().UnixNano())))
	})
	t.Run("dynamodb", func(t *testing.T) {
		ep := testenv.DynamoDB(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "local")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		scenario(t, real(t, fmt.Sprintf("dynamodb://console_%d?region=us-east-1&endpoint=%s", time.Now().UnixNano(), ep)))
	})
}

// Every page of the console renders on every store, and a stuck record
// is resolved through it.
func TestServeEveryPageOnEveryStore(t *testing.T) {
	onStores(t, func(t *testing.T, f *fixture) {
		keys := f.seed()
		f.getenv[EnvConsoleAuth] = "ops:" + consoleSecret
		c := consoletest.NewClient(t, f.serving("-write"))
		c.SignIn("ops", consoleSecret)
		rec := func(k idem.StoreKey) string { return "record?" + url.Values{"key": {k.String()}}.Encode() }
		for path, want := range map[string][]string{
			"":                      {"Stuck", `>1</a>`, "charge", "refund", "writes enabled", "signed in as"},
			"records":               {keys.Completed.String(), keys.Failed.String(), keys.Stuck.String(), keys.Fresh.String(), keys.Binary.String()},
			"records?stuck=1":       {keys.Stuck.String(), "(stuck)"},
			"records?status=failed": {keys.Failed.String()},
			"records?scope=charge/acme&older=1m&limit=10": {keys.Stuck.String(), keys.Completed.String()},
			rec(keys.Completed):                           {"ch_1001", "Resolve as FAILED"},
			rec(keys.Failed):                              {"card declined by issuer"},
			rec(keys.Stuck):                               {"console.aws.amazon.com", "Release"},
			rec(keys.Fresh):                               {"force"},
			rec(keys.Script):                              {"&lt;script&gt;"},
			rec(keys.Binary):                              {"binary (hex)"},
		} {
			code, body, _ := c.Get(path)
			if code != http.StatusOK {
				t.Errorf("GET /%s: %d\n%s", path, code, body)
				continue
			}
			for _, w := range want {
				if !strings.Contains(body, w) {
					t.Errorf("GET /%s: no %q", path, w)
				}
			}
			if strings.Contains(body, "<script") {
				t.Errorf("GET /%s: a script reached the page", path)
			}
		}
		if code, loc := c.Act(keys.Stuck, "complete", url.Values{"result": {`{"charge":"ch_1003"}`}}); code != http.StatusSeeOther {
			t.Fatalf("resolve: %d %s", code, loc)
		}
		if _, body, _ := c.Get(rec(keys.Stuck)); !strings.Contains(body, `<span class="status COMPLETED"`) || !strings.Contains(body, "ch_1003") {
			t.Fatalf("after resolve:\n%s", body)
		}
		if _, body, _ := c.Get("metrics"); !strings.Contains(body, `idem_console_actions_total{action="complete",outcome="done"} 1`) ||
			!strings.Contains(body, "idem_failed 1") {
			t.Fatalf("metrics:\n%s", body)
		}
	})
}

// serve reads nothing it should not: a read-only console over a store
// that fails on any write renders every page; -write without
// credentials is a usage error.
func TestServeReadOnly(t *testing.T) {
	f := setup(t)
	keys := f.seed()
	f.store = readOnlyStore{Store: f.store, t: t}
	c := consoletest.NewClient(t, f.serving())
	for _, path := range []string{"", "records", "records?stuck=1", "record?" + url.Values{"key": {keys.Stuck.String()}}.Encode()} {
		if code, body, _ := c.Get(path); code != http.StatusOK || !strings.Contains(body, "read-only") {
			t.Errorf("GET /%s: %d", path, code)
		}
	}
	if code, _, errOut := f.run("serve", "-write"); code != ExitUsage || !strings.Contains(errOut, "-write needs credentials") {
		t.Errorf("serve -write without credentials: %d %s", code, errOut)
	}
	f.getenv[EnvConsoleAuth] = "ops:short"
	if code, _, errOut := f.run("serve", "-write"); code != ExitError || !strings.Contains(errOut, "at least 12") {
		t.Errorf("serve with a short password: %d %s", code, errOut)
	}
}

var _ store.Store = readOnlyStore{}

// serve started before its store answers keeps trying (-store-wait),
// saying so, and serves once the store is up; with a wait too short it
// exits saying what to do.
func TestServeWaitsForItsStore(t *testing.T) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	px.Down()
	url := fmt.Sprintf("redis://%s/0?prefix=idemctl-wait-%d:", px.Addr(), time.Now().UnixNano())
	f := &fixture{t: t, clock: clocktest.New(time.Now()), getenv: map[string]string{EnvStore: url}}

	code, _, errOut := f.run("serve", "-listen", "127.0.0.1:0", "-store-wait", "300ms")
	if code == ExitOK || !strings.Contains(errOut, "store-wait") {
		t.Fatalf("serve with its store down past -store-wait: exit %d: %s", code, errOut)
	}

	var retried syncBuffer
	env := f.env(&syncBuffer{}, &retried)
	listening := make(chan string, 1)
	env.Listen = func(network, a string) (net.Listener, error) {
		ln, err := net.Listen(network, a)
		if err == nil {
			listening <- ln.Addr().String()
		}
		return ln, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- Run(ctx, []string{"serve", "-listen", "127.0.0.1:0", "-store-wait", "1m"}, env) }()
	for !strings.Contains(retried.String(), "store not open yet") {
		select {
		case code := <-done:
			cancel()
			t.Fatalf("serve exited %d while waiting: %s", code, retried.String())
		case <-time.After(20 * time.Millisecond): // serve's own retries, another goroutine's deadline
		}
	}
	if err := px.Up(); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-listening:
		resp, err := http.Get("http://" + a + "/")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the console once the store came back: %v %v", resp, err)
		}
		resp.Body.Close()
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, retried.String())
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("serve exited %d: %s", code, retried.String())
	}
}

// serve's sign-in flags reach the console: -secure-cookies marks the
// session cookie Secure (a TLS proxy serves the console), and
// -sign-in-failures closes sign-in to the client after that many
// failures; -sign-in-user-delay is one of them.
func TestServeSignInFlags(t *testing.T) {
	f := setup(t)
	f.getenv[EnvConsoleAuth] = "ops:" + consoleSecret
	c := consoletest.NewClient(t, f.serving("-secure-cookies", "-sign-in-failures", "2"))
	post := func(secret string) (int, http.Header) {
		code, _, h := c.PostWith("login", url.Values{"user": {"ops"}, "secret": {secret}}, nil)
		return code, h
	}
	for range 3 {
		if code, _ := post("wrong-password"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password: %d", code)
		}
	}
	if code, h := post(consoleSecret); code != http.StatusTooManyRequests || h.Get("Retry-After") != "30" {
		t.Fatalf("after 3 failures: %d %q, want 429 and Retry-After 30 (1m / 2)", code, h.Get("Retry-After"))
	}
	// A window on, the client's count has ended, and so has the user's
	// (whose failures would otherwise hold the sign-in a second).
	f.clock.Advance(time.Minute)
	if code, h := post(consoleSecret); code != http.StatusSeeOther || !strings.Contains(h.Get("Set-Cookie"), "; Secure") {
		t.Fatalf("sign-in: %d %q, want a Secure session cookie", code, h.Get("Set-Cookie"))
	}
	if code, _, errOut := f.run("serve", "-trusted-proxies", "nope"); code != ExitUsage || !strings.Contains(errOut, "-trusted-proxies") {
		t.Fatalf("bad -trusted-proxies: exit %d %q", code, errOut)
	}
	if code, _, errOut := f.run("serve", "-sign-in-user-delay", "0s"); code != ExitUsage || !strings.Contains(errOut, "-sign-in-user-delay") {
		t.Fatalf("-sign-in-user-delay 0s: exit %d %q", code, errOut)
	}
}

// A server asked to stop while a request is still in flight past the
// grace (a page waiting on a slow store) cuts it and stops: that is what
// was asked, not a failure (it used to end "context deadline exceeded",
// exit 1).
func TestStopCutsWhatOutlivesTheGrace(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	cut := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/")
		if err == nil {
			resp.Body.Close()
		}
		cut <- err
	}()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var warn bytes.Buffer
	if err := serveUntilDone(ctx, srv, errc, &warn, 50*time.Millisecond); err != nil {
		t.Fatalf("serveUntilDone: %v, want nil: the server stopped as asked", err)
	}
	if err := <-cut; err == nil {
		t.Error("the request in flight was answered, want it cut")
	}
	if !strings.Contains(warn.String(), "still in flight") {
		t.Errorf("no word of the cut requests: %q", warn.String())
	}
}
