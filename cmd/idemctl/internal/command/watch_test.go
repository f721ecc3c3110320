package command

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

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
	addr := regexp.MustCompile(`serving metrics on (http://\S+)`)
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m := addr.FindStringSubmatch(errb.String())
		if m == nil {
			continue
		}
		resp, err := http.Get(m[1])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); strings.Contains(body, "idem_monitor_last_sweep_timestamp_seconds ") && !strings.Contains(body, "idem_monitor_last_sweep_timestamp_seconds 0\n") {
			break
		}
	}
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
