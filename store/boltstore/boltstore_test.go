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
// after each Complete returned, until it is killed.
func crashChild() {
	path := os.Getenv("IDEM_CRASH_CHILD")
	start, _ := strconv.Atoi(os.Getenv("IDEM_CRASH_START"))
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1, LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	w := bufio.NewWriter(os.Stdout)
	for i := start; ; i++ {
		key := crashKey(i)
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "child", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 86_400_000})
		if err != nil || !res.Acquired {
			fmt.Println("claim:", key, err, res.Acquired)
			os.Exit(4)
		}
		if err := s.Complete(ctx, store.CompleteParams{Key: key, Fence: res.Record.Fence, Owner: res.Record.Owner, Now: now, ExpiresAt: now + 86_400_000, Result: crashResult(i)}); err != nil {
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
// times, and checks after each kill that the file opens and every
// acknowledged COMPLETED record is there, intact.
func TestCrashConsistency(t *testing.T) {
	t.Parallel()
	const kills = 200
	path := filepath.Join(t.TempDir(), "crash.db")
	var ackedKeys []int // every key any child acknowledged
	next := 0           // where the next child starts
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "IDEM_CRASH_CHILD="+path, "IDEM_CRASH_START="+strconv.Itoa(next))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		want := 1 + rng.IntN(8) // kill right after the Nth ack, mid-way through later writes
		last := -1
		for sc.Scan() {
			line := sc.Text()
			n, err := strconv.Atoi(strings.TrimPrefix(line, "ack "))
			if err != nil {
				t.Fatalf("round %d: child said %q", round, line)
			}
			last = n
			if want--; want == 0 {
				break
			}
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
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
	t.Logf("%d SIGKILLs, %d acknowledged completions all intact, %d completed records in the file",
		kills, len(ackedKeys), len(page.Records))
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
