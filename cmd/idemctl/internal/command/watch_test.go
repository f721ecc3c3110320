package command

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/store"
)

// readOnlyStore fails the test on any write.
type readOnlyStore struct {
	store.Store
	t *testing.T
}

func (r readOnlyStore) refuse(op string) error {
	r.t.Errorf("a read-only command called %s", op)
	return store.ErrUnavailable
}

func (r readOnlyStore) Claim(context.Context, store.ClaimParams) (store.ClaimResult, error) {
	return store.ClaimResult{}, r.refuse("Claim")
}
func (r readOnlyStore) Complete(context.Context, store.CompleteParams) error {
	return r.refuse("Complete")
}
func (r readOnlyStore) Fail(context.Context, store.FailParams) error { return r.refuse("Fail") }
func (r readOnlyStore) Release(context.Context, store.ReleaseParams) error {
	return r.refuse("Release")
}
func (r readOnlyStore) Extend(context.Context, store.ExtendParams) error { return r.refuse("Extend") }
func (r readOnlyStore) Delete(context.Context, string) error             { return r.refuse("Delete") }
func (r readOnlyStore) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	return r.Store.(store.Lister).List(ctx, p)
}

// watchOnce runs idemctl watch -metrics until its gauges show a sweep,
// and returns what /metrics served.
func watchOnce(t *testing.T, f *fixture) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, []string{"watch", "-metrics", "127.0.0.1:0", "-interval", "1h"}, f.env(&out, &errb))
	}()
	body, _ := scrapeUntil(t, &errb, 10*time.Second, func(body string) bool {
		return strings.Contains(body, "idem_monitor_last_sweep_timestamp_seconds ") && !strings.Contains(body, "idem_monitor_last_sweep_timestamp_seconds 0\n")
	})
	cancel()
	if c := <-code; c != ExitOK {
		t.Fatalf("watch: exit %d\n%s", c, errb.String())
	}
	return body + "\n" + errb.String()
}

func TestWatchServesGauges(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)
	got := watchOnce(t, f)
	for _, want := range []string{"idem_stuck 1\n", "idem_in_progress 2\n", "idem_failed 1\n", "idem_oldest_in_progress_age_seconds 120\n",
		"record stuck past its expected completion", keys["stuck"].String(), "ref=arn:aws:states:exec:a", "record failed"} {
		if !strings.Contains(got, want) {
			t.Errorf("watch lacks %q:\n%s", want, got)
		}
	}
}

func TestReadOnlyCommandsDoNotWrite(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)
	f.store = readOnlyStore{Store: f.store, t: t}
	f.must("list")
	f.must("list", "--stuck", "-o", "json")
	f.must("list", "--status", "failed", "--scope", "refund", "--older-than", "1s", "--limit", "1")
	for _, k := range keys {
		f.must("show", k.String())
		f.must("show", "-o", "json", k.String())
	}
	watchOnce(t, f)
}

// TestWatchReportsEvictionTurnedOn: idemctl watch on a Redis of the
// test's own (noeviction, maxmemory 8mb) serves
// idem_store_misconfigured{check="eviction"} 0; once the policy is
// changed to allkeys-lru under it (CONFIG SET), the next sweep logs that
// records may be forgotten and the gauge is 1; set back, it logs that the
// setting is right again and the gauge is 0.
func TestWatchReportsEvictionTurnedOn(t *testing.T) {
	t.Parallel()
	a := redisnodes.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	policy := func(p string) {
		t.Helper()
		if out, err := redisnodes.Cli(a, "config", "set", "maxmemory-policy", p); err != nil || out != "OK" {
			t.Fatalf("CONFIG SET maxmemory-policy %s: %s, %v", p, out, err)
		}
	}
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	f := &fixture{t: t, clock: clock, getenv: map[string]string{EnvStore: "redis://" + a + "/0"}}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, []string{"watch", "-metrics", "127.0.0.1:0", "-interval", "1m"}, f.env(&out, &errb))
	}()
	defer func() {
		cancel()
		if c := <-code; c != ExitOK {
			t.Errorf("watch: exit %d\n%s", c, errb.String())
		}
	}()
	// await waits (for the watch's goroutines) until /metrics serves want.
	await := func(want string) {
		t.Helper()
		if body, ok := scrapeUntil(t, &errb, 20*time.Second, func(body string) bool { return strings.Contains(body, want) }); !ok {
			t.Fatalf("/metrics never served %q:\n%s\n%s", want, body, errb.String())
		}
	}
	sweep := func() { // the next sweep, on the watch's clock
		for clock.Waiters() == 0 {
			runtime.Gosched()
		}
		clock.Advance(time.Minute)
	}
	await(`idem_store_misconfigured{check="eviction"} 0` + "\n")
	policy("allkeys-lru")
	sweep()
	await(`idem_store_misconfigured{check="eviction"} 1` + "\n")
	for _, want := range []string{"level=ERROR", "lets records be forgotten before their expiry; operations may run again",
		"check=eviction", "maxmemory-policy allkeys-lru", a} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, errb.String())
		}
	}
	policy("noeviction")
	sweep()
	await(`idem_store_misconfigured{check="eviction"} 0` + "\n")
	if !strings.Contains(errb.String(), "the store setting is right again") {
		t.Errorf("the log does not say the setting is right again:\n%s", errb.String())
	}
}

var metricsAddr = regexp.MustCompile(`serving metrics on (http://\S+)`)

// scrapeUntil reads the /metrics of the watch whose log is errb, every
// 5ms once the log names its address, until done holds for the body or
// within has passed (the watch runs on goroutines of its own); it returns
// the last body and whether done held.
func scrapeUntil(t *testing.T, errb *syncBuffer, within time.Duration, done func(body string) bool) (string, bool) {
	t.Helper()
	var body string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m := metricsAddr.FindStringSubmatch(errb.String())
		if m == nil {
			continue
		}
		resp, err := http.Get(m[1])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); done(body) {
			return body, true
		}
	}
	return body, false
}
