package boltstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// smallDisk mounts a tmpfs of size bytes (a real file system that runs
// out of space: ENOSPC) on a fresh folder, unmounted when the test ends.
// Mounting needs root (CAP_SYS_ADMIN): elsewhere the test skips, and fails
// in CI.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		testenv.Missing(t, "cannot mount a size-limited tmpfs ("+err.Error()+"): run as root")
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file in dir until the file system is full, then gives
// back leave bytes, and returns a function that deletes it.
func fill(t *testing.T, dir string, leave int64) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{64 << 10, 4 << 10, 1} {
		chunk := make([]byte, n)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	if leave > 0 {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(fi.Size() - leave); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

// A disk filling up (a 2 MiB tmpfs): under Config.MinFreeBytes free, a
// new claim is refused with a *DiskFullError (unavailable) and its
// operation does not run, while the claims already made complete into the
// space kept; with no space at all their writes fail as unavailable too.
// The file stays readable throughout (records read, completed ones
// replay) and takes no damage; once space is freed the same writes go
// through, and the file opens again with every record as the calls left
// it.
func TestFullDisk(t *testing.T) {
	dir := smallDisk(t, "2m")
	path := filepath.Join(dir, "idem.db")
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "LocalClaims", true: "SyncEveryClaim"}[sync], func(t *testing.T) {
			defer os.Remove(path)
			defer os.Remove(path + ".claims")
			fullDisk(t, dir, path, &boltstore.Config{SyncEveryClaim: sync, SweepInterval: -1, MinFreeBytes: 512 << 10})
		})
	}
}

func fullDisk(t *testing.T, dir, path string, cfg *boltstore.Config) {
	s, err := boltstore.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	e, err := idem.New(s, &idem.Config{RenewInterval: -1, WriteTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big := bytes.Repeat([]byte("r"), 32<<10) // new pages: the file must grow
	runs := map[string]int{}
	call := func(key string) (idem.Result[[]byte], error) {
		return idem.Do(ctx, e, idem.Request{Operation: "op", Key: key}, func(context.Context) ([]byte, error) { runs[key]++; return big, nil })
	}
	if _, err := call("before"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	claim := func(key string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: "o", Now: now, LeaseUntil: now + 600_000, ExpiresAt: now + 3_600_000}
	}
	complete := func(key string) store.CompleteParams {
		return store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Result: big}
	}
	for _, k := range []string{"held1", "held2"} {
		if res, err := s.Claim(ctx, claim(k)); err != nil || !res.Acquired {
			t.Fatalf("claim before the disk filled: %+v %v", res, err)
		}
	}
	readable := func(when string) {
		t.Helper()
		res, err := call("before")
		if err != nil || !res.Replayed || !bytes.Equal(res.Value, big) {
			t.Fatalf("replay %s: replayed %v, %d bytes, %v", when, res.Replayed, len(res.Value), err)
		}
		if rec, err := s.Get(ctx, "held2"); err != nil || rec.Status != store.StatusInProgress || rec.Fence != 1 {
			t.Fatalf("held record %s: %+v %v", when, rec, err)
		}
		if _, err := s.Get(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused claim left a record: %v", err)
		}
	}

	// Under MinFreeBytes: new claims refused, made ones complete.
	free := fill(t, dir, 128<<10)
	defer free()
	for i := range 3 {
		_, err := call("new")
		var df *boltstore.DiskFullError
		if !errors.As(err, &df) || !errors.Is(err, store.ErrUnavailable) || df.Free >= df.Min {
			t.Fatalf("call %d on a nearly full disk: %v, want a *DiskFullError", i, err)
		}
	}
	if _, err := s.Claim(ctx, claim("begun")); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim on a nearly full disk: %v, want unavailable", err)
	}
	if err := s.Complete(ctx, complete("held1")); err != nil {
		t.Fatalf("complete of a claim made, on a nearly full disk: %v", err)
	}
	readable("on a nearly full disk")

	// No space at all: the writes of claims made fail as unavailable.
	free()
	free = fill(t, dir, 0)
	if err := s.Complete(ctx, complete("held2")); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("complete on a full disk: %v, want unavailable", err)
	}
	if _, err := call("new"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("call on a full disk: %v, want unavailable", err)
	}
	if runs["new"] != 0 {
		t.Fatalf("the operation ran %d times without a claim", runs["new"])
	}
	readable("on a full disk")

	free()
	if err := s.Complete(ctx, complete("held2")); err != nil {
		t.Fatalf("complete once space is freed: %v", err)
	}
	for range 2 {
		if _, err := call("new"); err != nil {
			t.Fatalf("call once space is freed: %v", err)
		}
	}
	if runs["new"] != 1 || runs["before"] != 1 {
		t.Fatalf("runs %v, want each operation once", runs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = boltstore.Open(path, cfg); err != nil {
		t.Fatalf("reopening the file: %v", err)
	}
	for _, k := range []string{"held1", "held2", "new", "before"} {
		key := k
		if k == "new" || k == "before" {
			req := idem.Request{Operation: "op", Key: k}
			id, _ := req.Identity()
			key = id.StoreKey.String()
		}
		rec, err := s.Get(ctx, key)
		if err != nil || rec.Status != store.StatusCompleted || !bytes.Equal(rec.Result, big) {
			t.Fatalf("%s after reopening: %+v %v", k, rec, err)
		}
	}
}
