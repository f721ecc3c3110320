package boltstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_CRASH_CHILD") != "" {
		crashChild()
		return
	}
	if os.Getenv("IDEM_JOURNAL_CHILD") != "" {
		journalChild()
		return
	}
	if os.Getenv("IDEM_READONLY_CHILD") != "" {
		readOnlyChild()
		return
	}
	goleak.VerifyTestMain(m)
}

const limit = 4 << 20

func open(t *testing.T, cfg *boltstore.Config) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "idem.db"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		return open(t, &boltstore.Config{MaxResultBytes: limit})
	})
}

// localClaims makes every claim Local, as Do's are: the whole contract
// must hold for claims kept in memory too.
type localClaims struct{ *boltstore.Store }

func (s localClaims) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	p.Local = true
	return s.Store.Claim(ctx, p)
}

func TestConformanceLocalClaims(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		return localClaims{open(t, &boltstore.Config{MaxResultBytes: limit})}
	})
}

// TestConformanceLocalClaimsSynced: the same with SyncEveryClaim, every
// claim written and synced.
func TestConformanceLocalClaimsSynced(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		return localClaims{open(t, &boltstore.Config{MaxResultBytes: limit, SyncEveryClaim: true})}
	})
}

// TestConformanceLocalClaimsCheckpointing: the same with a journal so small
// that the committer checkpoints the held claims after every batch,
// racing every operation of the suite.
func TestConformanceLocalClaimsCheckpointing(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		return localClaims{open(t, &boltstore.Config{MaxResultBytes: limit, ClaimJournalMaxBytes: 1})}
	})
}

// copyFile copies the store's file as it stands: everything written to it
// so far, synced or not.
func copyFile(t *testing.T, from string) string {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return to
}

// TestLocalClaimsNeverReachTheFile: the file holds only what a crash must
// keep. A Local claim is held in memory; a copy of the file (all it was
// ever written, synced or not) opened while the claim is held does not
// have it, but has a Begin-style claim and a completed Local claim. This
// is the power-loss argument: what a crash loses is nothing the file
// has, and the file has only synced commits.
func TestLocalClaimsNeverReachTheFile(t *testing.T) {
	t.Parallel()
	s := open(t, &boltstore.Config{SweepInterval: -1})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key string, local bool) store.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o-" + key, Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: local})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return res
	}
	claim("held", true)
	claim("begun", false)
	done := claim("done", true)
	commits, _ := s.CommitStats()
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "done", Fence: done.Record.Fence, Owner: done.Record.Owner, Now: now}, ExpiresAt: now + 3_600_000, Result: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.CommitStats(); after != commits+1 {
		t.Fatalf("Complete of a held claim made %d commits, want 1", after-commits)
	}
	if r, err := s.Get(ctx, "held"); err != nil || r.Status != store.StatusInProgress {
		t.Fatalf("held claim through the store: %v %+v", err, r)
	}

	c, err := boltstore.Open(copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, "held"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the held Local claim reached the file: %v", err)
	}
	if r, err := c.Get(ctx, "begun"); err != nil || r.Status != store.StatusInProgress || r.Owner != "o-begun" {
		t.Errorf("the Begin-style claim is not in the file: %v %+v", err, r)
	}
	if r, err := c.Get(ctx, "done"); err != nil || r.Status != store.StatusCompleted || string(r.Result) != "ok" {
		t.Errorf("the completed Local claim is not in the file: %v %+v", err, r)
	}
}

// TestStepsReachTheFile: a step recorded under a held Local claim is in
// the file when RecordStep returns, the claim with it (a crash after it
// must not run the step again), and a retried step makes no commit.
func TestStepsReachTheFile(t *testing.T) {
	t.Parallel()
	s := open(t, &boltstore.Config{SweepInterval: -1})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	res, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: true})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %v %+v", err, res)
	}
	step := store.StepParams{ClaimRef: store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "o", Now: now},
		Step: store.Step{Name: "charge", Result: []byte("ch_1"), At: now}}
	if err := s.RecordStep(ctx, step); err != nil {
		t.Fatal(err)
	}
	commits, _ := s.CommitStats()
	if err := s.RecordStep(ctx, step); err != nil {
		t.Fatalf("retried step: %v", err)
	}
	if after, _ := s.CommitStats(); after != commits {
		t.Fatalf("a retried step made %d commits, want none", after-commits)
	}
	c, err := boltstore.Open(copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Get(ctx, "k")
	if err != nil || r.Status != store.StatusInProgress || len(r.Steps) != 1 || r.Steps[0].Name != "charge" || string(r.Steps[0].Result) != "ch_1" {
		t.Fatalf("the claim and its step in the file: %v %+v", err, r)
	}
}

// TestLocalClaimsAreWrittenWithSyncEveryClaim: with SyncEveryClaim a Do's
// claim is in the file when Claim returns, as every other claim.
func TestLocalClaimsAreWrittenWithSyncEveryClaim(t *testing.T) {
	t.Parallel()
	s := open(t, &boltstore.Config{SweepInterval: -1, SyncEveryClaim: true})
	now := time.Now().UnixMilli()
	if _, err := s.Claim(context.Background(), store.ClaimParams{Key: "k", Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: true}); err != nil {
		t.Fatal(err)
	}
	c, err := boltstore.Open(copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := c.Get(context.Background(), "k"); err != nil || r.Status != store.StatusInProgress {
		t.Fatalf("the claim in the file: %v %+v", err, r)
	}
}

// TestHeldClaims: what happens to a Local claim held in memory when it is
// extended, released, or the store is closed.
func TestHeldClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UnixMilli()
	p := func(key string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: true}
	}
	inFile := func(t *testing.T, s *boltstore.Store, key string) *store.Record {
		t.Helper()
		c, err := boltstore.Open(copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r, err := c.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("an extend writes it to the file", func(t *testing.T) {
		t.Parallel()
		s := open(t, &boltstore.Config{SweepInterval: -1})
		res, err := s.Claim(ctx, p("k"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now}, Ref: "exec-1"}); err != nil {
			t.Fatal(err)
		}
		r := inFile(t, s, "k")
		if r == nil || r.Status != store.StatusInProgress || r.Ref != "exec-1" || r.Fence != res.Record.Fence || r.Owner != "o" {
			t.Fatalf("extended claim in the file: %+v", r)
		}
	})

	t.Run("a release of a claim over nothing costs no commit", func(t *testing.T) {
		t.Parallel()
		s := open(t, &boltstore.Config{SweepInterval: -1})
		if _, err := s.Claim(ctx, p("k")); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "o", Now: now}}); err != nil {
			t.Fatal(err)
		}
		if commits, _ := s.CommitStats(); commits != 0 {
			t.Fatalf("%d commits", commits)
		}
		if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after release: %v", err)
		}
	})

	t.Run("a release deletes the record the claim replaced", func(t *testing.T) {
		t.Parallel()
		s := open(t, &boltstore.Config{SweepInterval: -1})
		old := p("k")
		old.Local, old.Owner, old.ExpiresAt = false, "old", now+10
		if _, err := s.Claim(ctx, old); err != nil {
			t.Fatal(err)
		}
		later := p("k")
		later.Now = now + 20 // the old record has expired
		res, err := s.Claim(ctx, later)
		if err != nil || !res.Acquired || res.Record.Fence != 2 {
			t.Fatalf("claim over the expired record: %v %+v", err, res)
		}
		if err := s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 2, Owner: "o", Now: later.Now}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after release: %v, want the old record gone too", err)
		}
		if r := inFile(t, s, "k"); r != nil {
			t.Fatalf("the file still has %+v", r)
		}
	})

	t.Run("close writes it to the file", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "idem.db")
		s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(ctx, p("k"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(ctx, p("k2")); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Local claim after Close: %v, want ErrUnavailable", err)
		}
		s, err = boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		r, err := s.Get(ctx, "k")
		if err != nil || r.Status != store.StatusInProgress || r.Fence != res.Record.Fence || r.Owner != "o" {
			t.Fatalf("held claim after close and reopen: %v %+v", err, r)
		}
		if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: r.Fence, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the sweeper forgets an expired one", func(t *testing.T) {
		t.Parallel()
		s := open(t, &boltstore.Config{SweepInterval: -1})
		c := p("k")
		c.ExpiresAt = now + 10
		if _, err := s.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Sweep(now + 10); err != nil || n != 1 {
			t.Fatalf("Sweep: %d %v", n, err)
		}
		if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after sweep: %v", err)
		}
	})
}

func TestSecondProcessFailsFastWhenLocked(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := boltstore.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// bbolt's flock conflicts between two opens even inside one process.
	_, err = boltstore.Open(path, &boltstore.Config{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, boltstore.ErrLocked) || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("second open: %v, want ErrLocked naming the file", err)
	}
}

func TestCorruptRecordFailsClosed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng, err := idem.New(s, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.Request{Operation: "charge", Key: "k"}
	r, err := idem.Do(ctx, eng, req, func(context.Context) (string, error) { return "paid", nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Flip one byte of the stored record behind the store's back.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("idem"))
		v := append([]byte(nil), b.Get([]byte(r.StoreKey))...)
		v[len(v)/2] ^= 0x40
		return b.Put([]byte(r.StoreKey), v)
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(ctx, r.StoreKey); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Get of a damaged record: %v, want ErrCorrupt", err)
	}
	eng, _ = idem.New(s, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ran := false
	_, err = idem.Do(ctx, eng, req, func(context.Context) (string, error) { ran = true; return "again", nil })
	if !errors.Is(err, store.ErrCorrupt) || !errors.Is(err, idem.ErrStore) || ran {
		t.Fatalf("call over a damaged record: %v ran=%v; want a store error wrapping ErrCorrupt and no execution", err, ran)
	}
}

func TestSweeperDeletesExpiredAndStopsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir, err := os.MkdirTemp("", "boltsweep")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		s, err := boltstore.Open(filepath.Join(dir, "idem.db"), &boltstore.Config{SweepInterval: time.Minute, SweepBatch: 7})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		now := time.Now().UnixMilli()
		for i := range 40 {
			exp := now + 30_000
			if i%4 == 0 {
				exp = now + 3_600_000
			}
			k := fmt.Sprintf("k%02d", i)
			if _, err := s.Claim(ctx, store.ClaimParams{Key: k, Owner: "o", Now: now, LeaseUntil: now + 10, ExpiresAt: exp}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Minute) // fake time
		synctest.Wait()
		page, err := s.List(ctx, store.ListParams{Now: now, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) != 10 {
			t.Fatalf("%d records after the sweep, want the 10 live ones", len(page.Records))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// crashChild claims and completes keys as fast as it can, printing "ack N"
// after each Complete returned, until it is killed. Even keys are claimed
// as Do claims them (Local: held in memory and journaled, never synced),
// odd keys as Begin does (written and synced); with IDEM_CRASH_SYNC the
// store writes and syncs Local claims too (SyncEveryClaim).
func crashChild() {
	path := os.Getenv("IDEM_CRASH_CHILD")
	start, _ := strconv.Atoi(os.Getenv("IDEM_CRASH_START"))
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1, LockTimeout: 10 * time.Second, SyncEveryClaim: os.Getenv("IDEM_CRASH_SYNC") != ""})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	w := bufio.NewWriter(os.Stdout)
	for i := start; ; i++ {
		key := crashKey(i)
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "child", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 86_400_000, Local: i%2 == 0})
		if err != nil || !res.Acquired {
			fmt.Println("claim:", key, err, res.Acquired)
			os.Exit(4)
		}
		fmt.Fprintf(w, "claim %d\n", i)
		w.Flush()
		if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: res.Record.Owner, Now: now}, ExpiresAt: now + 86_400_000, Result: crashResult(i)}); err != nil {
			fmt.Println("complete:", err)
			os.Exit(5)
		}
		fmt.Fprintf(w, "ack %d\n", i)
		w.Flush()
	}
}

func crashKey(i int) string    { return fmt.Sprintf("crash#%08d", i) }
func crashResult(i int) []byte { return []byte(strings.Repeat(strconv.Itoa(i), 1+i%50)) }

// TestCrashConsistency kills a writer with SIGKILL at random points, 200
// times, and checks after each kill that the file opens, every
// acknowledged COMPLETED record is there, intact, and the claim in flight
// left at most its IN_PROGRESS record (synced, or journaled when Local).
func TestCrashConsistency(t *testing.T) {
	t.Parallel()
	t.Run("claims written", func(t *testing.T) { t.Parallel(); crashConsistency(t, true) })
	t.Run("Local claims held", func(t *testing.T) { t.Parallel(); crashConsistency(t, false) })
}

func crashConsistency(t *testing.T, sync bool) {
	const kills = 200
	path := filepath.Join(t.TempDir(), "crash.db")
	var ackedKeys []int // every key any child acknowledged
	inFlight := 0       // kills with a claim acknowledged and not completed
	next := 0           // where the next child starts
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "IDEM_CRASH_CHILD="+path, "IDEM_CRASH_START="+strconv.Itoa(next))
		if sync {
			cmd.Env = append(cmd.Env, "IDEM_CRASH_SYNC=1")
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		want := 1 + rng.IntN(8) // kill right after the Nth ack, mid-way through later writes
		last, claimed := -1, -1 // the last key acknowledged, claimed
		parse := func(line string) (n int, ack bool) {
			s, ack := strings.CutPrefix(line, "ack ")
			if !ack {
				s, _ = strings.CutPrefix(line, "claim ")
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("round %d: child said %q", round, line)
			}
			return n, ack
		}
		for sc.Scan() {
			n, ack := parse(sc.Text())
			if !ack {
				claimed = n
				continue
			}
			last = n
			if want--; want == 0 {
				break
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for sc.Scan() { // what the child said before it died
			if n, ack := parse(sc.Text()); !ack {
				claimed = n
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		if last < 0 {
			t.Fatalf("round %d: the child acknowledged nothing", round)
		}
		start := next
		for i := start; i <= last; i++ {
			ackedKeys = append(ackedKeys, i)
		}
		// The child may have written (but not acknowledged) keys after
		// last; the next child starts past anything it might have touched.
		next = last + 1000

		s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		ctx := context.Background()
		for i := start; i <= last; i++ {
			checkAcked(t, s, ctx, i)
		}
		if claimed > last {
			// A claim whose Claim returned and whose Complete did not: the
			// key is held off (or completed, if the Complete got through).
			r, err := s.Get(ctx, crashKey(claimed))
			if err != nil || r.Owner != "child" || r.Status != store.StatusInProgress && r.Status != store.StatusCompleted {
				t.Fatalf("round %d: key %d, claimed when the child was killed: %v %+v", round, claimed, err, r)
			}
			inFlight++
		}
		for i := last + 1; i < next; i++ {
			r, err := s.Get(ctx, crashKey(i))
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				t.Fatalf("round %d: unacknowledged key %d: %v", round, i, err)
			case r.Status == store.StatusCompleted && string(r.Result) == string(crashResult(i)):
			case r.Status == store.StatusInProgress && r.Owner == "child":
			default:
				t.Fatalf("round %d: unacknowledged key %d (Local %v) left %v with result %q", round, i, i%2 == 0, r.Status, r.Result)
			}
		}
		if round == kills-1 || round%50 == 0 {
			// A full check now and then: every acknowledged key so far.
			page, err := s.List(ctx, store.ListParams{Now: time.Now().UnixMilli(), Limit: 1 << 30})
			if err != nil {
				t.Fatalf("round %d: List after crash: %v", round, err)
			}
			for _, r := range page.Records {
				if r.Status != store.StatusCompleted && r.Status != store.StatusInProgress {
					t.Fatalf("round %d: record %s in state %v", round, r.Key, r.Status)
				}
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Final audit: every key acknowledged in every round is COMPLETED with
	// its exact result.
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, i := range ackedKeys {
		checkAcked(t, s, context.Background(), i)
	}
	page, err := s.List(context.Background(), store.ListParams{Status: store.StatusCompleted, Now: time.Now().UnixMilli(), Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page.Records {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.Key, "crash#"))
		if string(r.Result) != string(crashResult(i)) {
			t.Fatalf("completed record %s has result %q", r.Key, r.Result)
		}
	}
	t.Logf("%d SIGKILLs, %d acknowledged completions all intact, %d completed records in the file, %d claims in flight kept",
		kills, len(ackedKeys), len(page.Records), inFlight)
}

// checkAcked fails the test unless acknowledged key i is COMPLETED with
// its exact result.
func checkAcked(t *testing.T, s *boltstore.Store, ctx context.Context, i int) {
	t.Helper()
	r, err := s.Get(ctx, crashKey(i))
	if err != nil {
		t.Fatalf("acknowledged key %d lost: %v", i, err)
	}
	if r.Status != store.StatusCompleted || string(r.Result) != string(crashResult(i)) {
		t.Fatalf("acknowledged key %d reverted: status %v result %q", i, r.Status, r.Result)
	}
}
