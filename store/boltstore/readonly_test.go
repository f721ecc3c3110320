package boltstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// fileSums returns the SHA-256 of the store file and of its claim journal.
func fileSums(t *testing.T, path string) string {
	t.Helper()
	out := ""
	for _, suffix := range []string{"", ".claims"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		out += fmt.Sprintf("%x ", sha256.Sum256(b))
	}
	return out
}

// A read-only open of a crashed writer's file (its claim journal still
// holding a claim) shows what the writer left, the held claim included,
// refuses every write, and leaves the file's and the journal's bytes as
// they were; the next writable open still restores the claim.
func TestReadOnlyChangesNothing(t *testing.T) {
	t.Parallel()
	now := time.Now().UnixMilli()
	w := open(t, &boltstore.Config{SweepInterval: -1})
	if err := journalScript(context.Background(), w, now); err != nil {
		t.Fatal(err)
	}
	path := snapshot(t, w, nil) // what a SIGKILL of the writer leaves
	before := fileSums(t, path)

	s, err := boltstore.Open(path, &boltstore.Config{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checkReadOnly(t, s, now)
	for name, err := range map[string]error{
		"claim":        second(s.Claim(ctx, localClaim("new", now))),
		"complete":     s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "child", Now: now}, ExpiresAt: now + 3_600_000}),
		"release":      s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "child", Now: now}}),
		"extend":       s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "child", Now: now}, LeaseUntil: now + 1}),
		"extend batch": errors.Join(s.ExtendBatch(ctx, []store.ExtendParams{{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "child", Now: now}, LeaseUntil: now + 1}})...),
		"delete":       s.Delete(ctx, "done"),
		"sweep":        second(s.Sweep(now + 10_000_000)),
	} {
		if !errors.Is(err, boltstore.ErrReadOnly) {
			t.Errorf("%s on a read-only store: %v, want ErrReadOnly", name, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if after := fileSums(t, path); after != before {
		t.Fatalf("a read-only open changed the file or its journal:\nbefore %s\nafter  %s", before, after)
	}
	checkScript(t, reopen(t, path, &boltstore.Config{SweepInterval: -1}), now)
}

func second[T any](_ T, err error) error { return err }

// checkReadOnly checks, without writing, what journalScript left.
func checkReadOnly(t *testing.T, s *boltstore.Store, now int64) {
	t.Helper()
	ctx := context.Background()
	if r, err := s.Get(ctx, "held"); err != nil || r.Status != store.StatusInProgress || r.Fence != 1 || r.LeaseUntil != now+60_000 {
		t.Fatalf("the crashed writer's held claim: %v %+v", err, r)
	}
	for _, k := range []string{"released", "deleted", "over"} {
		if r, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: %v %+v, want not found", k, err, r)
		}
	}
	if r, err := s.Get(ctx, "done"); err != nil || r.Status != store.StatusCompleted || string(r.Result) != "ok" {
		t.Errorf("done: %v %+v", err, r)
	}
	page, err := s.List(ctx, store.ListParams{Now: now + 61_000, Stuck: true})
	if err != nil || len(page.Records) != 1 || page.Records[0].Key != "held" {
		t.Errorf("stuck listing: %v %+v, want the held claim", err, page.Records)
	}
}

// readOnlyChild opens IDEM_READONLY_CHILD read-only (or, with
// IDEM_READONLY_WRITABLE set, for writing) and prints "ok" or the error.
func readOnlyChild() {
	now, _ := strconv.ParseInt(os.Getenv("IDEM_READONLY_NOW"), 10, 64)
	s, err := boltstore.Open(os.Getenv("IDEM_READONLY_CHILD"), &boltstore.Config{ReadOnly: os.Getenv("IDEM_READONLY_WRITABLE") == "", SweepInterval: -1})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	defer s.Close()
	r, err := s.Get(context.Background(), "held")
	if err != nil || r.LeaseUntil != now+60_000 {
		fmt.Println("get:", err)
		os.Exit(4)
	}
	fmt.Println("ok")
}

// A file the user may only read (and its journal, in a folder the user
// may not write) opens read-only; a writable open of it fails. As root,
// for whom file modes do not apply, the check runs in a child process
// with the credentials of nobody.
func TestReadOnlyOpensAReadOnlyFile(t *testing.T) {
	t.Parallel()
	now := time.Now().UnixMilli()
	w := open(t, &boltstore.Config{SweepInterval: -1})
	if err := journalScript(context.Background(), w, now); err != nil {
		t.Fatal(err)
	}
	src := snapshot(t, w, nil)
	dir, err := os.MkdirTemp("", "idem-readonly-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(dir, 0o755); _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "idem.db")
	for _, suffix := range []string{"", ".claims"} {
		b, err := os.ReadFile(src + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path+suffix, b, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(writable bool) (string, error) {
		if os.Geteuid() != 0 {
			s, err := boltstore.Open(path, &boltstore.Config{ReadOnly: !writable, SweepInterval: -1, LockTimeout: 100 * time.Millisecond})
			if err != nil {
				return "", err
			}
			checkReadOnly(t, s, now)
			return "ok", s.Close()
		}
		// The test binary, where nobody may run it.
		binDir, err := os.MkdirTemp("", "idem-readonly-bin-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(binDir) })
		bin := filepath.Join(binDir, "child")
		b, err := os.ReadFile(exe)
		if err == nil {
			err = os.Chmod(binDir, 0o755)
		}
		if err == nil {
			err = os.WriteFile(bin, b, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "IDEM_READONLY_CHILD="+path, "IDEM_READONLY_NOW="+strconv.FormatInt(now, 10))
		if writable {
			cmd.Env = append(cmd.Env, "IDEM_READONLY_WRITABLE=1")
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(false); err != nil {
		t.Fatalf("read-only open of a read-only file: %v: %s", err, out)
	}
	if out, err := run(true); err == nil {
		t.Fatalf("a writable open of a read-only file succeeded: %s", out)
	}
}

// A read-only open of a bbolt file no idem writer has set up (no bucket)
// finds nothing, and writes nothing.
func TestReadOnlyOfAnEmptyFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "empty.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(path, &boltstore.Config{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if r, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get: %v %+v", err, r)
	}
	if page, err := s.List(ctx, store.ListParams{Now: time.Now().UnixMilli()}); err != nil || len(page.Records) != 0 || page.Next != "" {
		t.Errorf("List: %v %+v", err, page)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("a read-only open changed the file")
	}
}
