package command

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a bytes.Buffer safe for a command's goroutines.
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

// fixture is a store, an application engine writing to it, and idemctl
// runs against it, all on one manual clock.
type fixture struct {
	t     *testing.T
	clock *clocktest.Clock
	// local, when set, is idemctl's clock instead of clock: a real-time
	// clock off the store's.
	local  store.Clock
	store  store.Store
	app    *idem.Engine
	stdin  string
	tty    bool
	getenv map[string]string
	// screenshots: the browser test saves this run's pages.
	screenshots bool
}

// setup makes a fixture on a fresh memstore; the clock starts at the real
// time, so stores with native TTLs keep the records.
func setup(t *testing.T) *fixture {
	t.Helper()
	clock := clocktest.New(time.Now().Truncate(time.Second))
	s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: clock})
	t.Cleanup(func() { s.Close() })
	return on(t, clock, s)
}

// on makes a fixture on s.
func on(t *testing.T, clock *clocktest.Clock, s store.Store) *fixture {
	t.Helper()
	app, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, clock: clock, store: s, app: app, getenv: map[string]string{EnvStore: "test:"}}
}

func (f *fixture) env(stdout, stderr *syncBuffer) Env {
	if f.store == nil { // a real store, opened from $IDEM_STORE as idemctl does
		e := System()
		e.Stdin, e.Stdout, e.Stderr, e.Clock = strings.NewReader(f.stdin), stdout, stderr, f.idemctlClock()
		e.Getenv = func(k string) string { return f.getenv[k] }
		e.StdinIsTerminal = func() bool { return f.tty }
		return e
	}
	return Env{
		Stdin: strings.NewReader(f.stdin), Stdout: stdout, Stderr: stderr,
		Getenv:          func(k string) string { return f.getenv[k] },
		StdinIsTerminal: func() bool { return f.tty },
		Clock:           f.idemctlClock(),
		Open: func(ctx context.Context, url string) (store.Store, func() error, error) {
			return f.store, func() error { return nil }, nil
		},
	}
}

// idemctlClock is the clock idemctl runs on.
func (f *fixture) idemctlClock() store.Clock {
	if f.local != nil {
		return f.local
	}
	return f.clock
}

// run runs idemctl args and returns its exit code, stdout and stderr.
func (f *fixture) run(args ...string) (int, string, string) {
	f.t.Helper()
	var out, errb syncBuffer
	code := Run(context.Background(), args, f.env(&out, &errb))
	return code, out.String(), errb.String()
}

// must runs idemctl args and fails the test unless it exits 0.
func (f *fixture) must(args ...string) string {
	f.t.Helper()
	code, out, errOut := f.run(args...)
	if code != ExitOK {
		f.t.Fatalf("idemctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// begin claims operation/key for work expected to take d, with ref.
func (f *fixture) begin(op, key string, d time.Duration, ref string) (idem.Token, idem.StoreKey) {
	f.t.Helper()
	ctx := context.Background()
	b, err := f.app.Begin(ctx, idem.Request{Operation: op, Key: key}, &idem.BeginOptions{ExpectedCompletion: d})
	if err != nil || !b.Acquired {
		f.t.Fatalf("begin %s %s: %+v %v", op, key, b, err)
	}
	if ref != "" {
		if err := f.app.Attach(ctx, b.Token, ref); err != nil {
			f.t.Fatal(err)
		}
	}
	return b.Token, b.Token.Key
}

// status reads key's record, nil when absent.
func (f *fixture) status(key idem.StoreKey) *idem.State {
	f.t.Helper()
	st, err := f.app.Status(context.Background(), key)
	if err != nil {
		return nil
	}
	return st
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for args, want := range map[string]string{
		"":                                  "usage: idemctl",
		"frobnicate":                        `unknown command "frobnicate"`,
		"list -status done":                 `-status "done"`,
		"list -limit 0":                     "-limit 0",
		"list -max-scan 0":                  "-max-scan 0",
		"list -o yaml":                      "want table or json",
		"list -scope bad#scope":             "-scope",
		"list extra":                        "no arguments",
		"show":                              "which key?",
		"show nokey":                        "not a store key",
		"show -scope charge":                "--scope and --key go together",
		"show a#b -scope charge -key k":     "either a store key or --scope",
		"resolve -yes -scope c -key k":      "resolve needs an outcome",
		"resolve -scope c -key k -fail x":   "want CODE:MESSAGE",
		"resolve -scope c -key k -result {": "not JSON",
		"list -bogus":                       "flag provided but not defined: -bogus",
	} {
		code, _, errOut := f.run(strings.Fields(args)...)
		if code != ExitUsage || !strings.Contains(errOut, want) {
			t.Errorf("idemctl %s: exit %d, stderr %q; want exit 2 saying %q", args, code, errOut, want)
		}
	}
	f.getenv = nil
	if code, _, errOut := f.run("list"); code != ExitUsage || !strings.Contains(errOut, "give -store URL or set $IDEM_STORE") {
		t.Errorf("no store: exit %d %q", code, errOut)
	}
	if code, out, _ := f.run("-h"); code != ExitOK || !strings.Contains(out, "exit codes") {
		t.Errorf("-h: exit %d %q", code, out)
	}
	if code, out, _ := f.run("resolve", "-h"); code != ExitOK || !strings.Contains(out, "CODE:MESSAGE") {
		t.Errorf("resolve -h: exit %d %q", code, out)
	}
}

func TestParseInterleaved(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"KEY", "-o", "json"}, {"-o", "json", "KEY"}, {"-o", "json", "--", "KEY"}} {
		var k keyFlags
		fs := newTestFlagSet(&k)
		pos, err := parseInterleaved(fs, args)
		if err != nil || len(pos) != 1 || pos[0] != "KEY" || fs.Lookup("o").Value.String() != "json" {
			t.Errorf("%q: %q %v", args, pos, err)
		}
	}
}
