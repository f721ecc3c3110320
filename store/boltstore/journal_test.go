package boltstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// journalChild opens the store in its default mode, leaves keys in every
// state a held claim can reach, says "ready" and waits to be killed.
func journalChild() {
	path := os.Getenv("IDEM_JOURNAL_CHILD")
	now, _ := strconv.ParseInt(os.Getenv("IDEM_JOURNAL_NOW"), 10, 64)
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1, LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	if err := journalScript(context.Background(), s, now); err != nil {
		fmt.Println(err)
		os.Exit(4)
	}
	fmt.Println("ready")
	select {}
}

func localClaim(key string, now int64) store.ClaimParams {
	return store.ClaimParams{Key: key, Owner: "child", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: true}
}

// journalScript: "held" held; "released" claimed and released; "deleted"
// claimed, completed and deleted; "over" claimed over an expired record
// and released (both gone); "done" claimed and completed.
func journalScript(ctx context.Context, s *boltstore.Store, now int64) error {
	if _, err := s.Claim(ctx, localClaim("held", now)); err != nil {
		return err
	}
	if _, err := s.Claim(ctx, localClaim("released", now)); err != nil {
		return err
	}
	if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "released", Fence: 1, Owner: "child", Now: now}}); err != nil {
		return err
	}
	if _, err := s.Claim(ctx, localClaim("deleted", now)); err != nil {
		return err
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "deleted", Fence: 1, Owner: "child", Now: now}, ExpiresAt: now + 3_600_000}); err != nil {
		return err
	}
	if err := s.Delete(ctx, "deleted"); err != nil {
		return err
	}
	old := localClaim("over", now)
	old.Local, old.Owner, old.ExpiresAt = false, "old", now+10
	if _, err := s.Claim(ctx, old); err != nil {
		return err
	}
	if res, err := s.Claim(ctx, localClaim("over", now+20)); err != nil || res.Record.Fence != 2 {
		return fmt.Errorf("claim over: %v %+v", err, res)
	}
	if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "over", Fence: 2, Owner: "child", Now: now + 20}}); err != nil {
		return err
	}
	if _, err := s.Claim(ctx, localClaim("done", now)); err != nil {
		return err
	}
	return s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "done", Fence: 1, Owner: "child", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte("ok")})
}

// checkScript checks the keys journalScript left, after a crash.
func checkScript(t *testing.T, s *boltstore.Store, now int64) {
	t.Helper()
	ctx := context.Background()
	r, err := s.Get(ctx, "held")
	if err != nil || r.Status != store.StatusInProgress || r.Fence != 1 || r.Owner != "child" || r.LeaseUntil != now+60_000 {
		t.Fatalf("the held claim after the crash: %v %+v", err, r)
	}
	for _, k := range []string{"released", "deleted", "over"} {
		if r, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s came back: %v %+v", k, err, r)
		}
	}
	if r, err := s.Get(ctx, "done"); err != nil || r.Status != store.StatusCompleted || string(r.Result) != "ok" {
		t.Errorf("done: %v %+v", err, r)
	}
	// The crashed holder's key is held off until its lease ends.
	other := store.ClaimParams{Key: "held", Owner: "next", Now: now + 1_000, LeaseUntil: now + 61_000, ExpiresAt: now + 3_600_000, Local: true}
	if res, err := s.Claim(ctx, other); err != nil || res.Acquired {
		t.Fatalf("claim within the dead holder's lease: %v %+v", err, res)
	}
	other.Now, other.LeaseUntil = now+60_000, now+120_000
	if res, err := s.Claim(ctx, other); err != nil || !res.Acquired || res.Record.Fence != 2 {
		t.Fatalf("claim after the dead holder's lease: %v %+v", err, res)
	}
}

// TestKilledHoldersClaimComesBack: a process SIGKILLed while it holds a
// Local claim (default mode: in memory and in the unsynced journal) leaves
// it IN_PROGRESS for the next process, until its lease ends; what it
// released, settled or deleted does not come back.
func TestKilledHoldersClaimComesBack(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.Now().UnixMilli()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEM_JOURNAL_CHILD="+path, "IDEM_JOURNAL_NOW="+strconv.FormatInt(now, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q", sc.Text())
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if fi, err := os.Stat(path + ".claims"); err != nil || fi.Size() == 0 {
		t.Fatalf("the claim journal after the kill: %v %v", err, fi)
	}
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, err := os.Stat(path + ".claims"); err != nil || fi.Size() != 0 {
		t.Fatalf("the claim journal after Open: %v %v, want empty", err, fi)
	}
	checkScript(t, s, now)
}

// snapshot copies the store's file and its journal as they stand (all
// written so far, synced or not: what a SIGKILL leaves), the journal
// passed through cut first, and returns the copy's path.
func snapshot(t *testing.T, s *boltstore.Store, cut func([]byte) []byte) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy.db")
	for _, suffix := range []string{"", ".claims"} {
		b, err := os.ReadFile(s.Path() + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if suffix != "" && cut != nil {
			b = cut(b)
		}
		if err := os.WriteFile(to+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func reopen(t *testing.T, path string, cfg *boltstore.Config) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestClaimJournalPowerLoss: power loss can leave the journal short of its
// unsynced tail, torn mid-entry, or with garbage in it. Open restores the
// entries before the first damaged one, ignores the rest, and loses
// nothing synced.
func TestClaimJournalPowerLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	s := open(t, &boltstore.Config{SweepInterval: -1})
	if err := journalScript(ctx, s, now); err != nil {
		t.Fatal(err)
	}
	// Ten more held claims, one journal entry each; ends[i] is where the
	// entry of claim i ends.
	var ends []int64
	for i := range 10 {
		if _, err := s.Claim(ctx, localClaim(fmt.Sprintf("k%d", i), now)); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(s.Path() + ".claims")
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, fi.Size())
	}
	check := func(t *testing.T, path string, kept int) {
		t.Helper()
		c := reopen(t, path, &boltstore.Config{SweepInterval: -1})
		for i := range 10 {
			r, err := c.Get(ctx, fmt.Sprintf("k%d", i))
			if i < kept && (err != nil || r.Status != store.StatusInProgress || r.Fence != 1) {
				t.Fatalf("k%d (before the damage) after reopen: %v %+v", i, err, r)
			}
			if i >= kept && !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("k%d (from the damage on) after reopen: %v %+v", i, err, r)
			}
		}
		checkScript(t, c, now)
	}
	t.Run("intact", func(t *testing.T) { check(t, snapshot(t, s, nil), 10) })
	t.Run("torn mid-entry", func(t *testing.T) {
		check(t, snapshot(t, s, func(b []byte) []byte { return b[:ends[8]+5] }), 9)
	})
	t.Run("torn in a length", func(t *testing.T) {
		check(t, snapshot(t, s, func(b []byte) []byte { return b[:ends[8]+3] }), 9)
	})
	t.Run("bytes flipped in the tail", func(t *testing.T) {
		check(t, snapshot(t, s, func(b []byte) []byte { b[ends[5]+12] ^= 0xff; return b }), 6)
	})
	t.Run("zeros in the tail", func(t *testing.T) {
		check(t, snapshot(t, s, func(b []byte) []byte {
			clear(b[ends[2]:])
			return b
		}), 3)
	})
}

// TestClaimJournalCheckpoint: past ClaimJournalMaxBytes the committer writes
// the held claims into the file (one synced commit) and empties the
// journal; the claims are still held, settle as before, and survive a
// crash from the file.
func TestClaimJournalCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	s := open(t, &boltstore.Config{SweepInterval: -1, ClaimJournalMaxBytes: 400})
	size := func() int64 {
		fi, err := os.Stat(s.Path() + ".claims")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	for i := range 20 { // about 1,700 bytes of journal
		if _, err := s.Claim(ctx, localClaim(fmt.Sprintf("k%02d", i), now)); err != nil {
			t.Fatal(err)
		}
	}
	// The committer checkpoints when a Claim takes the journal over its
	// size, and after a batch before it replies: once a commit returned,
	// the journal is within its size.
	begun := localClaim("begun", now)
	begun.Local = false
	if _, err := s.Claim(ctx, begun); err != nil {
		t.Fatal(err)
	}
	if n := size(); n > 400 {
		t.Fatalf("the journal holds %d bytes after a commit, over its 400", n)
	}
	if commits, _ := s.CommitStats(); commits != 1 {
		t.Fatalf("%d commits counted, want the one of begun", commits)
	}
	// The file alone (no journal) has the held claims.
	c := reopen(t, copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
	if r, err := c.Get(ctx, "k00"); err != nil || r.Status != store.StatusInProgress || r.Owner != "child" {
		t.Fatalf("k00 in the file after the checkpoint: %v %+v", err, r)
	}
	// Still held: they settle, and a release does not leave the
	// checkpointed copy behind.
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k00", Fence: 1, Owner: "child", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "k01", Fence: 1, Owner: "child", Now: now}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, localClaim("after", now)); err != nil {
		t.Fatal(err)
	}
	c = reopen(t, snapshot(t, s, nil), &boltstore.Config{SweepInterval: -1})
	if r, err := c.Get(ctx, "k00"); err != nil || r.Status != store.StatusCompleted {
		t.Fatalf("k00 after the crash: %v %+v", err, r)
	}
	if r, err := c.Get(ctx, "k01"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("released k01 came back: %v %+v", err, r)
	}
	for _, k := range []string{"k02", "after"} {
		if r, err := c.Get(ctx, k); err != nil || r.Status != store.StatusInProgress {
			t.Fatalf("%s after the crash: %v %+v", k, err, r)
		}
	}
}
