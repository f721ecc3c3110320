package command

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

func TestWritesNeedConfirmation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)
	k := keys["stuck"].String()
	for _, args := range [][]string{{"release", k}, {"delete", k}, {"resolve", k, "--fail", "x:y"}} {
		code, _, errOut := f.run(args...)
		if code != ExitError || !strings.Contains(errOut, "refusing to write without --yes: stdin is not a terminal") {
			t.Errorf("%v: exit %d %q", args, code, errOut)
		}
	}
	f.tty, f.stdin = true, "n\n"
	if code, _, errOut := f.run("release", k); code != ExitError || !strings.Contains(errOut, "not confirmed") || !strings.Contains(errOut, "[y/N]") {
		t.Errorf("answered n: exit %d %q", code, errOut)
	}
	if st := f.status(keys["stuck"]); st == nil || st.Status != idem.StatusInProgress {
		t.Fatalf("the record changed: %+v", st)
	}
	f.stdin = "y\n"
	if out := f.must("release", k); !strings.Contains(out, "released "+k) {
		t.Fatalf("release: %q", out)
	}
	if f.status(keys["stuck"]) != nil {
		t.Fatal("released record still there")
	}
}

func TestReleaseRefusesWorkInProgressAndCompletedRecords(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)
	code, _, errOut := f.run("release", "--yes", keys["running"].String())
	if code != ExitError || !strings.Contains(errOut, "within its expected completion") || !strings.Contains(errOut, "--force") {
		t.Fatalf("running: exit %d %q", code, errOut)
	}
	code, _, errOut = f.run("release", "--yes", keys["completed"].String())
	if code != ExitError || !strings.Contains(errOut, "use delete") {
		t.Fatalf("completed: exit %d %q", code, errOut)
	}
	f.must("release", "--yes", "--force", keys["running"].String())
	f.must("release", "--yes", keys["failed"].String())
	f.must("delete", "--yes", keys["completed"].String())
	for _, n := range []string{"running", "failed", "completed"} {
		if f.status(keys[n]) != nil {
			t.Errorf("%s record still there", n)
		}
	}
	if code, _, _ := f.run("delete", "--yes", keys["completed"].String()); code != ExitNotFound {
		t.Fatalf("deleting an absent record: exit %d", code)
	}
}

func TestResolveIsReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "result.json")
	if err := os.WriteFile(file, []byte(`{"id": 42}`), 0o600); err != nil {
		t.Fatal(err)
	}
	f.must("resolve", "--yes", keys["stuck"].String(), "--result", "@"+file)
	f.must("resolve", "--yes", "--scope", "refund", "--key", "c", "--fail", "refund_manual:refunded by hand")

	ran := false
	var got struct{ ID int }
	res, err := idem.Do(ctx, f.app, idem.Request{Operation: "charge", Key: "a"}, func(context.Context) (struct{ ID int }, error) {
		ran = true
		return struct{ ID int }{1}, nil
	})
	got = res.Value
	if err != nil || ran || got.ID != 42 || !res.Replayed {
		t.Fatalf("duplicate after resolve: %+v %v, ran %v", res, err, ran)
	}
	st := f.status(keys["stuck"])
	if st.ExpiresAt.Sub(st.CompletedAt) != 24*time.Hour {
		t.Errorf("resolved record kept for %v, want the application's 24h", st.ExpiresAt.Sub(st.CompletedAt))
	}
	_, err = idem.Do(ctx, f.app, idem.Request{Operation: "refund", Key: "c"}, func(context.Context) (int, error) {
		ran = true
		return 0, nil
	})
	var term *idem.TerminalError
	if !errors.As(err, &term) || term.Code != "refund_manual" || term.Message != "refunded by hand" || ran {
		t.Fatalf("duplicate after resolve --fail: %v", err)
	}
	// A settled record can be corrected: FAILED → COMPLETED, from stdin.
	f.stdin = `"ok"`
	f.must("resolve", "--yes", keys["failed"].String(), "--result", "@-", "--expiry", "1h")
	if st := f.status(keys["failed"]); st.Status != idem.StatusCompleted || string(st.Result) != `"ok"` || st.ExpiresAt.Sub(st.CompletedAt) != time.Hour {
		t.Fatalf("corrected record: %+v", st)
	}
}

// racingStore runs before once, just before the first fenced write: the
// record changes between idemctl's read and its write.
type racingStore struct {
	store.Store
	before func()
	done   bool
}

func (r *racingStore) race() {
	if !r.done {
		r.done = true
		r.before()
	}
}

func (r *racingStore) Complete(ctx context.Context, p store.CompleteParams) error {
	r.race()
	return r.Store.Complete(ctx, p)
}

func (r *racingStore) Fail(ctx context.Context, p store.FailParams) error {
	r.race()
	return r.Store.Fail(ctx, p)
}

func (r *racingStore) Release(ctx context.Context, p store.ReleaseParams) error {
	r.race()
	return r.Store.Release(ctx, p)
}

func TestWritesAreRefusedWhenTheRecordChangedUnderneath(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"release"}, {"delete"}, {"resolve", "--result", `"x"`}, {"resolve", "--fail", "c:m"}} {
		t.Run(args[0], func(t *testing.T) {
			f := setup(t)
			tok, key := f.begin("charge", "a", time.Minute, "")
			f.clock.Advance(2 * time.Minute)
			// The holder finishes after all, between idemctl's read and write.
			f.store = &racingStore{Store: f.store, before: func() {
				if err := f.app.Complete(context.Background(), tok, "late"); err != nil {
					t.Error(err)
				}
			}}
			code, _, errOut := f.run(append(append([]string{}, args...), "--yes", key.String())...)
			if code != ExitError || !strings.Contains(errOut, "changed underneath") || !strings.Contains(errOut, "COMPLETED") {
				t.Fatalf("exit %d, %q", code, errOut)
			}
			if st := f.status(key); st.Status != idem.StatusCompleted || string(st.Result) != `"late"` {
				t.Fatalf("the holder's outcome was overwritten: %+v", st)
			}
		})
	}
}

// IDEM_DISABLED, left in an operator's environment, does not turn
// idemctl's writes into no-ops: release, resolve and resolve --fail
// really change the records.
func TestWritesIgnoreIdemDisabled(t *testing.T) {
	f := setup(t) // the application's engine, made before the variable is set
	_, released := f.begin("charge", "r", time.Minute, "")
	_, completed := f.begin("charge", "c", time.Minute, "")
	_, failed := f.begin("charge", "f", time.Minute, "")
	f.clock.Advance(2 * time.Minute)
	t.Setenv("IDEM_DISABLED", "true")
	f.must("release", "--yes", released.String())
	f.must("resolve", "--yes", completed.String(), "--result", `"ok"`)
	f.must("resolve", "--yes", failed.String(), "--fail", "c:m")
	if st := f.status(released); st != nil {
		t.Fatalf("released record: %+v", st)
	}
	if st := f.status(completed); st == nil || st.Status != idem.StatusCompleted || string(st.Result) != `"ok"` {
		t.Fatalf("resolved record: %+v", st)
	}
	if st := f.status(failed); st == nil || st.Status != idem.StatusFailed || st.Err.Code != "c" {
		t.Fatalf("failed record: %+v", st)
	}
}
